"""Proxies the tests put between the agent and what it talks to: counting bytes, injecting faults."""
