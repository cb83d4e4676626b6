#!/usr/bin/env bash
# kafka-run-class.sh CLASS [ARGS]: a Kafka class on the image's jars, as Kafka's own script runs it
# (KAFKA_HEAP_OPTS, KAFKA_JVM_PERFORMANCE_OPTS, KAFKA_OPTS, KAFKA_LOG4J_OPTS as there).
set -euo pipefail
heap="${KAFKA_HEAP_OPTS:--Xmx256M}"
perf="${KAFKA_JVM_PERFORMANCE_OPTS:--server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -XX:MaxInlineLevel=15 -Djava.awt.headless=true}"
log4j="${KAFKA_LOG4J_OPTS:--Dlog4j2.configurationFile=/etc/kafka/docker/log4j2.properties}"
# shellcheck disable=SC2086 # the options are lists of words, as in Kafka's script
exec java $heap $perf $log4j ${KAFKA_OPTS:-} -cp "/opt/kafka/libs/*" "$@"
