"""The coordinator: Replication Manager, Handover Manager and their metadata (docs/design.md §3-§4)."""
