"""What operators run beside the job: ``safepoint serve`` and the HTTP surface of ``safepoint run``
(``serve``, ``http_api`` with its ``dashboard``, ``status_store``, ``metrics``, ``job_status``),
the levers (``control_cli``: ``hold``, ``pause``, ``resume``) and the live screen (``view``)."""
