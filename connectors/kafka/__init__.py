"""The Kafka plumbing the node client, the job and the tools share: the two client libraries
(``clients``), one way to make and rebuild a producer (``producer``), the topics and their creation
(``topics``), following topics without a consumer group (``follow``), an idle consumer that only asks
for end offsets (``idle``), and the directives read at a job's start (``seeds``). What a database node
imports is one level up (``safepoint.connectors``: ``Reporter``, ``DirectiveListener``, ``ServiceHold``)."""
