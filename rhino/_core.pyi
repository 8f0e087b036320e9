"""Type stubs for rhino._core, the private compiled module (see bindings/)."""

from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

__version__: str
ROCKSDB_VERSION: str
ROCKSDB_BUILD: str
ROCKSDB_CRC32C: str

# Every status code but OK (src/cpp/include/rhino/status_codes.h): (number, name, class in rhino.errors).
def status_codes() -> list[tuple[int, str, str]]: ...

Key = bytes | bytearray | memoryview | str | int | np.integer[Any]
# Keys may also be a pyarrow int64 or binary/string array (no nulls).
Keys = npt.NDArray[np.int64] | Sequence[Key] | Any
# Values may also be a pyarrow binary/string array (no nulls), viewed without copying.
Values = npt.NDArray[Any] | Sequence[bytes | bytearray | memoryview] | Any

class Partitioner:
    def __init__(self, *, num_key_groups: int = 32768, num_vnodes: int = 256, seed: int = 0) -> None: ...
    @property
    def num_key_groups(self) -> int: ...
    @property
    def num_vnodes(self) -> int: ...
    @property
    def seed(self) -> int: ...
    def hash(self, key: Key) -> int: ...
    def key_group(self, key: Key) -> int: ...
    def vnode(self, key: Key) -> int: ...
    def key_groups(self, keys: Keys) -> npt.NDArray[np.int32]: ...
    def vnodes(self, keys: Keys) -> npt.NDArray[np.int32]: ...
    def vnode_of_key_group(self, key_group: int) -> int: ...
    def key_group_range(self, vnode: int) -> tuple[int, int]: ...

def routed_key(head: Key, routing: Key, tail: Key = b"", *, ttl: bool = False) -> bytes: ...
def routed_keys(heads: bytes | Keys, routings: Keys, tails: bytes | Keys = b"", *, ttl: bool = False) -> list[bytes]: ...
def split_routed_key(key: Key) -> tuple[bytes, bytes, bytes, int] | None: ...

class RoutingTable:
    def __init__(self, assignment: npt.ArrayLike, num_instances: int, *, epoch: int = 0) -> None: ...
    @staticmethod
    def from_ring(
        num_vnodes: int, num_instances: int, *, epoch: int = 0, tokens_per_instance: int = 64, seed: int = 0
    ) -> RoutingTable: ...
    @property
    def epoch(self) -> int: ...
    @property
    def num_vnodes(self) -> int: ...
    @property
    def num_instances(self) -> int: ...
    @property
    def assignment(self) -> npt.NDArray[np.int32]: ...
    def instance_of(self, vnode: int) -> int: ...
    def instances_of(self, vnodes: npt.ArrayLike) -> npt.NDArray[np.int32]: ...
    def vnodes_of(self, instance: int) -> list[int]: ...
    def reassign(self, vnodes: Sequence[int], target: int) -> RoutingTable: ...

class FileEntry:
    name: str
    size: int
    checksum: str
    identity: str
    in_delta: bool

class Manifest:
    operator_id: str
    instance: int
    checkpoint_id: int
    epoch: int
    version: int
    vnodes: list[int]
    files: list[FileEntry]
    created_unix_ms: int
    @property
    def parent_id(self) -> int | None: ...
    @property
    def num_key_groups(self) -> int: ...
    @property
    def num_vnodes(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def total_bytes(self) -> int: ...
    @property
    def delta_bytes(self) -> int: ...
    @property
    def delta_files(self) -> int: ...

class RestoreStats:
    files: int
    linked_files: int
    copied_files: int
    copied_bytes: int
    total_bytes: int
    fell_back_to_copy: bool
    from_standby: bool
    build_seconds: float
    open_seconds: float
    open_cpu_seconds: float
    open_wait_seconds: float

class VerifyProblem:
    operator_id: str
    instance: int
    checkpoint_id: int
    file: str
    detail: str

class VerifyReport:
    checkpoints: int
    files_checked: int
    bytes_checked: int
    problems: list[VerifyProblem]
    @property
    def ok(self) -> bool: ...
    def __bool__(self) -> bool: ...

class ReplicaStore:
    def __init__(self, path: str) -> None: ...
    @property
    def path(self) -> str: ...
    def checkpoints(self, operator_id: str, instance: int) -> list[int]: ...
    def instances(self) -> list[tuple[str, int]]: ...
    def manifest(self, operator_id: str, instance: int, checkpoint_id: int) -> Manifest: ...
    def restore(
        self,
        operator_id: str,
        instance: int,
        checkpoint_id: int,
        target: str,
        *,
        mode: Literal["link", "copy"] = "link",
        verify: Literal["size", "full"] = "size",
        write_buffer_budget: int = 268435456,
        compaction: Literal["level", "universal"] = "level",
        flush_threads: int = 1,
        checkpoint_wal_bytes: int = 262144,
        progress: Callable[[str, int, int, int, int], object] | None = None,
        sync: bool = True,
        latency_critical: bool = False,
    ) -> StateBackend: ...
    def restore_files(
        self,
        operator_id: str,
        instance: int,
        checkpoint_id: int,
        target: str,
        *,
        mode: Literal["link", "copy"] = "link",
        verify: Literal["size", "full"] = "size",
        progress: Callable[[str, int, int, int, int], object] | None = None,
    ) -> RestoreStats: ...
    def verify(
        self,
        *,
        operator_id: str = "",
        instance: int = 0,
        full: bool = True,
        progress: Callable[[int, int], object] | None = None,
    ) -> VerifyReport: ...
    def retain(self, operator_id: str, instance: int, keep_last: int) -> list[int]: ...
    def gc(self) -> dict[str, int]: ...
    def pool_path(self, identity: str) -> str: ...

class WriteBatch:
    def put(self, keys: Keys, values: Values) -> None: ...
    def delete(self, keys: Keys) -> None: ...
    def clear(self) -> None: ...
    def __len__(self) -> int: ...

class StateBackend:
    @staticmethod
    def open(
        path: str,
        *,
        partitioner: Partitioner | None = None,
        operator_id: str = "op",
        instance: int = 0,
        vnodes: Sequence[int] | None = None,
        write_buffer_budget: int = 268435456,
        read_only: bool = False,
        create: bool = True,
        compaction: Literal["level", "universal"] = "level",
        flush_threads: int = 1,
        checkpoint_wal_bytes: int = 262144,
    ) -> StateBackend: ...
    @property
    def path(self) -> str: ...
    @property
    def operator_id(self) -> str: ...
    @property
    def instance(self) -> int: ...
    @property
    def compaction(self) -> Literal["level", "universal"]: ...
    @property
    def partitioner(self) -> Partitioner: ...
    @property
    def vnodes(self) -> list[int]: ...
    @property
    def version(self) -> int | None: ...
    @property
    def last_checkpoint(self) -> int | None: ...
    @property
    def restore_stats(self) -> RestoreStats | None: ...
    @property
    def closed(self) -> bool: ...  # True once close() has begun
    def get(self, key: Key) -> bytes | None: ...
    def put(self, key: Key, value: bytes) -> None: ...
    def delete(self, key: Key) -> None: ...
    def put_batch(self, keys: Keys, values: Values, *, version: int | None = None) -> None: ...
    def delete_batch(self, keys: Keys, *, version: int | None = None) -> None: ...
    def batch(self) -> WriteBatch: ...
    def write(self, batch: WriteBatch, *, version: int | None = None) -> None: ...
    def get_batch(self, keys: Keys) -> list[bytes | None]: ...
    def get_batch_array(self, keys: Keys, width: int) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_]]: ...
    def get_batch_arrow(self, keys: Keys, *, large: bool | None = None) -> Any: ...  # pyarrow.BinaryArray | LargeBinaryArray
    def scan(self, vnode: int) -> list[tuple[bytes, bytes]]: ...
    def count(self, vnode: int) -> int: ...
    def checkpoint(self, store: ReplicaStore, checkpoint_id: int, *, epoch: int = 0) -> Manifest: ...
    def export_vnodes(self, vnodes: Sequence[int], path: str) -> None: ...
    def import_vnodes(self, path: str) -> list[int]: ...
    def drop_vnodes(self, vnodes: Sequence[int]) -> None: ...
    def stats(self) -> list[dict[str, int]]: ...
    def flush(self) -> None: ...
    def wait_for_compactions(self, timeout: float | None = None) -> bool: ...
    def compact(self) -> dict[str, int]: ...  # bytes_before, bytes_after (live SST bytes of the vnodes)
    def set_ttl_clock(self, ms: int) -> None: ...
    @property
    def ttl_clock(self) -> int | None: ...
    def close(self) -> None: ...  # from any thread: waits for the calls under way; later calls raise InvalidArgumentError
    def _in_call(self, fn: Callable[[], Any]) -> Any: ...  # for tests: fn() runs as part of a call (close() waits for it)
    def __enter__(self) -> StateBackend: ...
    def __exit__(self, *args: object) -> None: ...

# ---- data plane (docs/protocol.md) ----

MAX_FRAME_BYTES: int
MAX_NUM_VNODES: int  # per instance (kMaxNumVnodes): more is InvalidArgument, in the worker and the coordinator
FRAME_HEADER_BYTES: int
# Default bounds on one listener's connections (docs/protocol.md §2, "Connection limits").
MAX_CONNECTIONS: int
MAX_UNAUTHENTICATED_CONNECTIONS: int
MAX_CONNECTIONS_PER_PEER: int
MAX_UNAUTHENTICATED_PER_PEER: int
MAX_STREAMS_PER_CONNECTION: int  # streams a peer holds open on one connection (docs/protocol.md §2)
MAX_OUTBOUND_BYTES: int  # bytes queued for one peer before its connection stops reading it (docs/protocol.md §2)
# Default bounds on what a worker's state service holds (docs/protocol.md §7.1, "Bounds").
MAX_INSTANCES: int
MAX_CHECKPOINT_READERS: int

class Worker:
    def __init__(
        self,
        *,
        id: str,
        store_dir: str,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        secret: bytes | str,
        io_threads: int = 1,
        disk_threads: int = 2,
        heartbeat_ms: int = 500,
        peer_timeout_ms: int = 3000,
        max_frame_bytes: int = ...,
        max_window: int = 64,
        stream_idle_timeout_ms: int = 60000,
        state_dir: str = "",  # the state service's directory; "" = no state service
        unix_socket: str = "",  # a Unix socket for clients on this host (owner-only); "" = none
        service_threads: int = 4,
        max_session_bytes: int = 1 << 30,
        replicate_timeout_ms: int = 60000,
        session_idle_timeout_ms: int = 600000,  # 0 = never
        keep_checkpoints: int = 3,  # per instance in the replica store; 0 = keep all, else >= 2
        retention_interval_ms: int = 10000,
        tls_cert: str = "",
        tls_key: str = "",
        tls_ca: str = "",
        max_connections: int = ...,  # per listener; 0 = no bound
        max_unauthenticated_connections: int = ...,  # handshakes in progress per listener
        max_connections_per_peer: int = ...,  # per peer IP address (TCP)
        max_unauthenticated_per_peer: int = ...,  # handshakes in progress per peer IP address (TCP)
        max_instances: int = ...,  # instances hosted at once; 0 = no bound
        max_checkpoint_readers: int = ...,  # checkpoint readers open at once; 0 = no bound
        max_streams_per_connection: int = ...,  # streams one peer holds open on one connection; 0 = no bound
        max_outbound_bytes: int = ...,  # bytes queued for one peer before reading it pauses; 0 = no bound
    ) -> None: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def join(self) -> None: ...
    @property
    def port(self) -> int: ...
    @property
    def id(self) -> str: ...
    def metrics(self) -> dict[str, Any]: ...

class ReplicationHandle:
    def progress(self) -> dict[str, Any]: ...
    @property
    def done(self) -> bool: ...
    def cancel(self) -> None: ...
    def wait(self, timeout: float | None = None) -> dict[str, Any] | None: ...

def replicate(
    store_dir: str,
    operator_id: str,
    instance: int,
    checkpoint_id: int,
    chain: Sequence[str],
    *,
    chain_version: int,
    secret: bytes | str,
    chunk_bytes: int = 1048576,
    window: int = 16,
    timeout_ms: int = 30000,
    heartbeat_ms: int = 500,
    peer_timeout_ms: int = 3000,
    client_id: str = "primary",
    role: str = "admin",
    scope: str = "",
    derived: bool = False,
) -> ReplicationHandle: ...
def query_store(
    address: str, *, secret: bytes | str, operator_id: str, instance: int, timeout_ms: int = 5000,
    role: str = "admin", scope: str = "", derived: bool = False,
) -> list[int]: ...
# The key of `role` with `scope`, derived from the cluster's root secret (docs/protocol.md §2, "Roles").
def credential_key(root: bytes, role: str, scope: str = "") -> bytes: ...

# The state client (rhino/client/, docs/protocol.md §7).
class StateClient:
    @staticmethod
    def connect(
        address: str,
        secret: bytes,
        client_id: str = "client",
        max_frame_bytes: int = ...,
        peer_timeout_ms: int = 3000,
        request_timeout_ms: int = 120000,
        local_bind_host: str = "",
        # what the client proves (docs/protocol.md §2, "Roles"): `role` with `scope`, its key derived
        # from `secret` (the root), or `secret` itself when derived (a rhino.Credential's key)
        role: str = "admin",
        scope: str = "",
        derived: bool = False,
    ) -> StateClient: ...
    def instance(self, action: str, operator_id: str, instance: int, epoch: int, args: str = "{}") -> str: ...
    # A CoordReq to a coordinator (docs/protocol.md §8): method is [a-z_]{1,64}, args_json a JSON document;
    # returns the answer's JSON, or raises the rhino error of the answer's code. Releases the GIL.
    def coord(self, method: str, args_json: str) -> str: ...
    def open_session(
        self, operator_id: str, instance: int, batch: int, epoch: int,
        attempt: int | None = None, committed: int | None = None,
    ) -> tuple[ClientSession, int | None, bool]: ...
    # A checkpoint reader (docs/protocol.md §7.9): a ClientSession that takes no writes, the checkpoint
    # id it reads (the newest of the worker's store for None) and its vnodes. Releases the GIL.
    def read_checkpoint(
        self, operator_id: str, instance: int, checkpoint: int | None
    ) -> tuple[ClientSession, int, list[int]]: ...
    def close(self) -> None: ...
    @property
    def is_open(self) -> bool: ...
    @property
    def is_unix(self) -> bool: ...
    @property
    def address(self) -> str: ...
    @property
    def max_frame_bytes(self) -> int: ...

class ClientSession:
    def get_batch(self, keys: Any) -> list[bytes | None]: ...
    def get_batch_array(self, keys: Any, width: int) -> tuple[np.ndarray, np.ndarray]: ...
    def get_batch_arrow(self, keys: Any, *, large: bool | None = None) -> Any: ...
    def put_batch(self, keys: Any, values: Any) -> None: ...
    def delete_batch(self, keys: Any) -> None: ...
    def _scan_page(
        self, vnode: int | None, prefix: bytes, after_vnode: int | None, after_key: bytes | None, max_items: int
    ) -> tuple[list[bytes], list[bytes], bool, int]: ...
    def scan_many(
        self, items: Sequence[tuple[int | None, bytes]], max_items: int
    ) -> list[tuple[list[tuple[bytes, bytes]], bool]]: ...
    def commit(self, mode: str = "barrier", *, batch_time_ms: int | None = None) -> tuple[int, str]: ...
    def abort(self, reason: str = "aborted by the client") -> None: ...
    @property
    def open(self) -> bool: ...
    @property
    def batch(self) -> int: ...
    @property
    def round_trips(self) -> int: ...

# The coordinator's transport (docs/protocol.md §8).
class CoordServer:
    # handler(method, args_json) -> (code, message, result_json), code 0 = ok, called on one of `threads`
    # handler threads with the GIL held. An exception answers the code of its rhino error class, or
    # RhinoIOError's with "TypeName: message" for any other.
    def __init__(
        self,
        host: str,
        port: int,
        secret: bytes,
        handler: Callable[[str, str], tuple[int, str, str | None]],
        *,
        server_id: str = "coordinator",
        threads: int = 4,
        max_frame_bytes: int = ...,
        heartbeat_ms: int = 500,
        peer_timeout_ms: int = 3000,
        tls_cert: str = "",
        tls_key: str = "",
        tls_ca: str = "",
        max_connections: int = ...,  # 0 = no bound (docs/protocol.md §2, "Connection limits")
        max_unauthenticated_connections: int = ...,
        max_connections_per_peer: int = ...,
        max_unauthenticated_per_peer: int = ...,
        lane_methods: list[str] = [],  # the liveness lane: these methods have lane_threads threads of their own
        lane_threads: int = 1,
        # True: handler(method, args_json, caller), caller = (role, scope, peer_id: bytes, address), who the
        # connection proved to be (docs/protocol.md §2, "Roles")
        with_caller: bool = False,
    ) -> None: ...
    @property
    def port(self) -> int: ...
    @property
    def host(self) -> str: ...
    @property
    def address(self) -> str: ...  # "host:port"
    @property
    def closed(self) -> bool: ...
    def metrics(self) -> dict[str, int]: ...
    # Lets the handlers under way finish, answers queued requests Aborted, closes the connections.
    # Idempotent; waits with the GIL released; InvalidArgumentError from inside its own handler.
    def close(self) -> None: ...
    def __enter__(self) -> CoordServer: ...
    def __exit__(self, *args: object) -> None: ...
