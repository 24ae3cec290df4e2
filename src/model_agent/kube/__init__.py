"""The Kubernetes plumbing: talking to the API server and keeping a local, trustworthy view of it.

Role: the bottom layer for everything that crosses the wire to the API server, in the manner of
client-go's ``rest`` + ``tools/cache`` + ``util/workqueue``: an authenticated client with deadlines
(:mod:`~model_agent.kube.client`), the URLs of each kind (:mod:`~model_agent.kube.resources`), a
client-side rate limit (:mod:`~model_agent.kube.ratelimit`), the reflector that keeps a cache equal to the
server's list (:mod:`~model_agent.kube.reflector`, :mod:`~model_agent.kube.store`) and the work queue that
hands "look at key K again" to workers (:mod:`~model_agent.kube.workqueue`).

Guarantees:

* no request leaves without a deadline, and every failure is a typed error (``ApiError`` with the status,
  ``ApiUnavailable`` for transport and timeouts);
* the cache reports a vanished object as a candidate to confirm, never as a fact, and never triggers
  anything itself: what is destructive is decided above this package;
* nothing here knows about models, the node's disk or OME: objects are plain dicts. This package imports
  no other package of the agent (checked by ``make lint``'s import contracts).
"""
