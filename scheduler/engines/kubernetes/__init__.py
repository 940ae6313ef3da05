"""The Kubernetes engine: queue jobs as Jobs, indexed Jobs or PyTorchJobs (`launcher.py`), their pods
(`pods.py`), how the queue's GPUs reach them (`devices.py`: node affinity, device requests or DRA
claims), Kueue's objects and workloads (`kueue.py`), where the device plugin put them (`dcgm.py`),
and the objects rendered for people to read (`render.py`)."""
