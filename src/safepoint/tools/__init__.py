"""Development and demonstration tools, apart from the runtime: the embedded broker (``broker``),
the cluster simulator (``simulate``), the demo (``demo``), the soak run (``soak``) and the checker
that reads a soak's topics back against a model of the contract (``checker``)."""
