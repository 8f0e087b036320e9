// Crash points: named places where a test can have this process SIGKILL itself.
//
// Set RHINO_CRASH_POINT=<name> in a child process and it raises SIGKILL the
// first time execution reaches CrashPoint("<name>"). This is a real kill -9 at
// a chosen instant, as RocksDB's own TEST_KILL_RANDOM does; the crash tests use
// it to prove that no half-written checkpoint or restore is ever visible. The
// cost when the variable is unset is one cached string comparison.
#pragma once

namespace rhino {
void CrashPoint(const char* name);

// Fault points: RHINO_FAULT_POINT=<name> makes FaultPoint("<name>") return
// true, every time, so that a test can drive an error path that real
// hardware rarely takes (an fsync that fails). Same cost as CrashPoint.
bool FaultPoint(const char* name);

// Delay points: RHINO_DELAY_POINT=<name>:<ms> makes DelayPoint("<name>") sleep
// that long, every time, so that a test can hold a lock or a state open for as
// long as it needs (a commit that a busy disk makes slow). Same cost as
// CrashPoint when unset.
void DelayPoint(const char* name);
}  // namespace rhino
