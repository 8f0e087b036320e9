// util/fs.h: the POSIX helpers every store and state directory goes through.
// Results are checked with plain syscalls (stat, readdir, open), not with the
// helpers themselves.
#include "util/fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "testing/test_util.h"

namespace rhino {
namespace {

using testing::List;
using testing::Slurp;
using testing::TempDir;
using testing::WriteBytes;

bool PathExists(const std::string& p) {
  struct stat st;
  return ::lstat(p.c_str(), &st) == 0;
}

TEST(FsTest, WriteFileAtomicCreatesReplacesAndLeavesNoTemporary) {
  TempDir t;
  const std::string p = t.Sub("meta.json");
  std::string big(200000, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131);
  for (bool sync : {true, false}) {
    ASSERT_OK(fs::WriteFileAtomic(p, "first", sync));
    EXPECT_EQ(Slurp(p), "first");
    ASSERT_OK(fs::WriteFileAtomic(p, big, sync));
    EXPECT_EQ(Slurp(p), big);
    ASSERT_OK(fs::WriteFileAtomic(p, "", sync));
    EXPECT_EQ(Slurp(p), "");
    EXPECT_EQ(List(t.path()), (std::vector<std::string>{"meta.json"}));
  }
  // Into a directory that does not exist: an error, and nothing created.
  EXPECT_CODE(fs::WriteFileAtomic(t.Sub("no/such/file"), "x"), kNotFound);
  EXPECT_FALSE(PathExists(t.Sub("no")));
}

TEST(FsTest, ReadFileReadsBinaryBeyondOneBufferAndMissingIsNotFound) {
  TempDir t;
  std::string data(3 * 65536 + 7, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i % 251);
  WriteBytes(t.Sub("f"), data);
  std::string got = "stale";
  ASSERT_OK(fs::ReadFile(t.Sub("f"), &got));
  EXPECT_EQ(got, data);
  WriteBytes(t.Sub("empty"), "");
  ASSERT_OK(fs::ReadFile(t.Sub("empty"), &got));
  EXPECT_EQ(got, "");
  EXPECT_CODE(fs::ReadFile(t.Sub("missing"), &got), kNotFound);
}

TEST(FsTest, ListDirIsSortedWithoutDotEntries) {
  TempDir t;
  for (const char* n : {"b", "a10", "A", "a2", ".hidden", "z"}) WriteBytes(t.Sub(n), "");
  ASSERT_OK(fs::MakeDirs(t.Sub("dir")));
  std::vector<std::string> names = {"stale"};
  ASSERT_OK(fs::ListDir(t.path(), &names));
  // Byte order: '.' < 'A' < 'a' < 'b' < 'd' < 'z'; "a10" < "a2".
  EXPECT_EQ(names, (std::vector<std::string>{".hidden", "A", "a10", "a2", "b", "dir", "z"}));
  ASSERT_OK(fs::ListDir(t.Sub("dir"), &names));
  EXPECT_TRUE(names.empty());
  EXPECT_CODE(fs::ListDir(t.Sub("missing"), &names), kNotFound);
}

TEST(FsTest, MakeDirsCreatesEveryLevelAndIsIdempotent) {
  TempDir t;
  const std::string deep = t.Sub("a/b/c/d");
  ASSERT_OK(fs::MakeDirs(deep));
  struct stat st;
  ASSERT_EQ(::stat(deep.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_OK(fs::MakeDirs(deep));
  EXPECT_OK(fs::MakeDirs(deep + "/"));
  EXPECT_TRUE(fs::IsDir(deep));
  // A regular file on the way down is an error.
  WriteBytes(t.Sub("file"), "x");
  EXPECT_FALSE(fs::MakeDirs(t.Sub("file/sub")).ok());
}

// BUG: util/fs.cc MakeDirs treats mkdir's EEXIST as success without checking that the existing
// path is a directory, so MakeDirs("<regular file>") returns OK and no directory exists.
TEST(FsTest, MakeDirsOnARegularFileIsAnError) {
  TempDir t;
  WriteBytes(t.Sub("file"), "x");
  EXPECT_FALSE(fs::MakeDirs(t.Sub("file")).ok()) << "mkdir -p on a file must fail";
  EXPECT_FALSE(fs::IsDir(t.Sub("file")));
}

TEST(FsTest, RemoveAllRemovesATreeButNotWhatASymlinkPointsTo) {
  TempDir t;
  ASSERT_OK(fs::MakeDirs(t.Sub("keep")));
  WriteBytes(t.Sub("keep/precious"), "data");
  ASSERT_OK(fs::MakeDirs(t.Sub("tree/x/y")));
  WriteBytes(t.Sub("tree/f"), "1");
  WriteBytes(t.Sub("tree/x/y/g"), "2");
  ASSERT_EQ(::chmod(t.Sub("tree/f").c_str(), 0444), 0);  // read-only files go too (pool files are 0400)
  ASSERT_EQ(::symlink(t.Sub("keep").c_str(), t.Sub("tree/x/link").c_str()), 0);
  ASSERT_OK(fs::RemoveAll(t.Sub("tree")));
  EXPECT_FALSE(PathExists(t.Sub("tree")));
  EXPECT_EQ(Slurp(t.Sub("keep/precious")), "data");
  // Absent is fine; a single file is removed.
  EXPECT_OK(fs::RemoveAll(t.Sub("tree")));
  WriteBytes(t.Sub("single"), "s");
  ASSERT_OK(fs::RemoveAll(t.Sub("single")));
  EXPECT_FALSE(PathExists(t.Sub("single")));
}

TEST(FsTest, CopyFileCopiesBytesAndRefusesToOverwrite) {
  TempDir t;
  std::string data(1 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 7) ^ (i >> 9));
  WriteBytes(t.Sub("src"), data);
  ASSERT_OK(fs::CopyFile(t.Sub("src"), t.Sub("dst")));
  EXPECT_EQ(Slurp(t.Sub("dst")), data);
  struct stat a, b;
  ASSERT_EQ(::stat(t.Sub("src").c_str(), &a), 0);
  ASSERT_EQ(::stat(t.Sub("dst").c_str(), &b), 0);
  EXPECT_NE(a.st_ino, b.st_ino);  // a copy, not a link
  ASSERT_OK(fs::CopyFile(t.Sub("src"), t.Sub("dst-nosync"), /*sync=*/false));
  EXPECT_EQ(Slurp(t.Sub("dst-nosync")), data);
  WriteBytes(t.Sub("empty"), "");
  ASSERT_OK(fs::CopyFile(t.Sub("empty"), t.Sub("empty2")));
  EXPECT_EQ(Slurp(t.Sub("empty2")), "");

  WriteBytes(t.Sub("other"), "do not clobber");
  EXPECT_CODE(fs::CopyFile(t.Sub("src"), t.Sub("other")), kAlreadyExists);
  EXPECT_EQ(Slurp(t.Sub("other")), "do not clobber");
  EXPECT_CODE(fs::CopyFile(t.Sub("missing"), t.Sub("dst2")), kNotFound);
  EXPECT_FALSE(PathExists(t.Sub("dst2")));
}

TEST(FsTest, LinkSharesTheInodeAndRefusesAnExistingTarget) {
  TempDir t;
  WriteBytes(t.Sub("a"), "content");
  bool cross = true;
  ASSERT_OK(fs::Link(t.Sub("a"), t.Sub("b"), &cross));
  EXPECT_FALSE(cross);
  struct stat sa, sb;
  ASSERT_EQ(::stat(t.Sub("a").c_str(), &sa), 0);
  ASSERT_EQ(::stat(t.Sub("b").c_str(), &sb), 0);
  EXPECT_EQ(sa.st_ino, sb.st_ino);
  EXPECT_EQ(sa.st_nlink, 2u);
  uint64_t dev = 0, ino = 0;
  ASSERT_OK(fs::Inode(t.Sub("b"), &dev, &ino));
  EXPECT_EQ(ino, static_cast<uint64_t>(sa.st_ino));
  EXPECT_EQ(dev, static_cast<uint64_t>(sa.st_dev));

  cross = true;
  EXPECT_CODE(fs::Link(t.Sub("a"), t.Sub("b"), &cross), kAlreadyExists);
  EXPECT_FALSE(cross);
  EXPECT_CODE(fs::Link(t.Sub("missing"), t.Sub("c"), &cross), kNotFound);
  EXPECT_FALSE(cross);
}

TEST(FsTest, RenameFileSizeAndFsyncReportMissingPathsAsNotFound) {
  TempDir t;
  WriteBytes(t.Sub("a"), "12345");
  uint64_t size = 0;
  ASSERT_OK(fs::FileSize(t.Sub("a"), &size));
  EXPECT_EQ(size, 5u);
  ASSERT_OK(fs::Rename(t.Sub("a"), t.Sub("b")));
  EXPECT_FALSE(PathExists(t.Sub("a")));
  EXPECT_EQ(Slurp(t.Sub("b")), "12345");
  EXPECT_CODE(fs::Rename(t.Sub("a"), t.Sub("c")), kNotFound);
  EXPECT_CODE(fs::FileSize(t.Sub("a"), &size), kNotFound);
  EXPECT_CODE(fs::FsyncPath(t.Sub("a")), kNotFound);
  EXPECT_OK(fs::FsyncPath(t.Sub("b")));
  EXPECT_OK(fs::FsyncParent(t.Sub("b")));
  EXPECT_OK(fs::FsyncDirTree(t.path()));
  EXPECT_FALSE(fs::Exists(t.Sub("a")));
  EXPECT_TRUE(fs::Exists(t.Sub("b")));
}

TEST(FsTest, JoinParentAndBasenameSplitPaths) {
  EXPECT_EQ(fs::Join("a", "b"), "a/b");
  EXPECT_EQ(fs::Join("a/", "b"), "a/b");
  EXPECT_EQ(fs::Join("", "b"), "b");
  EXPECT_EQ(fs::Join("/", "b"), "/b");
  EXPECT_EQ(fs::Parent("/a/b/c"), "/a/b");
  EXPECT_EQ(fs::Parent("/a/b/c/"), "/a/b");
  EXPECT_EQ(fs::Parent("/a"), "/");
  EXPECT_EQ(fs::Parent("/"), "/");
  EXPECT_EQ(fs::Parent("name"), ".");
  EXPECT_EQ(fs::Parent("rel/name"), "rel");
  EXPECT_EQ(fs::Basename("/a/b/c"), "c");
  EXPECT_EQ(fs::Basename("/a/b/c/"), "c");
  EXPECT_EQ(fs::Basename("name"), "name");
}

TEST(FsTest, RandomHexHasTwoLowercaseDigitsPerByteAndVaries) {
  for (int n : {0, 1, 6, 32}) {
    const std::string h = fs::RandomHex(n);
    EXPECT_EQ(h.size(), static_cast<size_t>(2 * n));
    EXPECT_TRUE(std::all_of(h.begin(), h.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }))
        << h;
  }
  EXPECT_NE(fs::RandomHex(16), fs::RandomHex(16));
}

}  // namespace
}  // namespace rhino
