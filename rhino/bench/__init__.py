"""The benchmark drivers behind ``rhino bench`` (bench/README.md).

- :mod:`rhino.bench.restore`: ``rhino bench restore``, hard-link vs copy restore per state size;
- :mod:`rhino.bench.replicate`: ``rhino bench replicate``, chain-replication throughput;
- :mod:`rhino.bench.overhead`: ``rhino bench overhead``, a primary's write rate while it replicates;
- :mod:`rhino.bench.workload`: the synthetic keyed state they (and the demo) write;
- :mod:`rhino.bench.common`: what the drivers that run worker processes share.
"""
