"""What developers run, apart from the runtime: the embedded broker (``broker``), the cluster
simulator (``simulate``), the demo (``demo``), the soak run (``soak``) and the independent checker
that reads a run's topics back against a model of the contract of its own (``checker``, with
``check_result`` and ``check_kafka``; its reading of an event, ``safepoint.ops.contract_check``, is
shared with the live auditor)."""
