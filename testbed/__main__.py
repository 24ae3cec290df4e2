"""``python -m testbed``: build and run the local control plane and emulators, and the demo."""

from testbed.cli import app

app()
