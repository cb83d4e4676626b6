package dev.safepoint.client;

/** A replication group the node takes part in, as a heartbeat reports it. */
public record Group(String group, boolean leader, long publishedMinTxTime) {}
