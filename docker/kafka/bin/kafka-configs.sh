#!/usr/bin/env bash
# kafka.admin.ConfigCommand, as in Apache Kafka's bin/ (256 MB of heap, warnings only on stderr)
KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xmx256M}" KAFKA_LOG4J_OPTS="${KAFKA_LOG4J_OPTS:--Dlog4j2.configurationFile=/etc/kafka/docker/tools-log4j2.properties}" exec /opt/kafka/bin/kafka-run-class.sh kafka.admin.ConfigCommand "$@"
