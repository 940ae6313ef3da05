"""Durable state: the queue's tables (`schema.py`), the job store on SQLite or PostgreSQL
(`store.py`) with the bounds a job must keep to be queued (`bounds.py`), claims that never
over-allocate a GPU (`claims.py`), dispatcher leases (`leases.py`), the change versions a
dispatcher reads between cycles (`versions.py`), and the static fleet file the inventory is read
from (`inventory.py`)."""
