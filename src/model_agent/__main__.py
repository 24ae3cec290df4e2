"""``python -m model_agent``: the same CLI as the ``model-agent`` console script."""

from model_agent.cli.main import app

app()
