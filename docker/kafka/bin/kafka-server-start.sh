#!/usr/bin/env bash
# kafka-server-start.sh server.properties: the broker, as in Apache Kafka's bin/ (1 GB of heap unless
# KAFKA_HEAP_OPTS says otherwise)
KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xmx1G -Xms1G}" exec /opt/kafka/bin/kafka-run-class.sh kafka.Kafka "$@"
