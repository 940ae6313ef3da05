"""The local engine: a claimed job as a process group on this machine, or on the queue's node through
`queue.node_commands` (`launcher.py`)."""
