package dev.safepoint.client;

import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.OptionalLong;

/**
 * A reporter's open holds, its readers and transactions by id in the order they opened, and the bounds a new hold
 * is checked against: the cluster's safe point and the namespaces' bounds the node learnt of. Not thread-safe: the
 * reporter calls it with its lock held.
 */
final class HoldRegistry {
    /** The newest bound a hold is protected at, and whose it is (said in a refusal). */
    record Bound(long ts, String whose) {}

    private final String node;
    private final Map<String, Reader> readers = new HashMap<>();
    private final Map<String, Transaction> txs = new HashMap<>();
    private long order;
    private Long safeTs;
    private Long nsBase;
    private Map<String, Long> nsBounds = Map.of();

    HoldRegistry(String node) {
        this.node = node;
    }

    private Map<String, ? extends Hold> of(HoldKind kind) {
        return kind == HoldKind.READER ? readers : txs;
    }

    /** The open hold of that kind and id, or null. */
    Hold get(HoldKind kind, String id) {
        return of(kind).get(id);
    }

    /** Throws when a hold of h's kind and id is open already: ids are unique on a node. */
    void checkNew(Hold h) {
        if (of(h.kind()).containsKey(h.id)) {
            String what = h.kind() == HoldKind.READER ? "reader" : "transaction";
            throw new IllegalArgumentException("safepoint: " + what + " id \"" + h.id + "\" is already open on node "
                    + node + "; ids must be unique");
        }
    }

    /** Keeps an opened hold, the next in the order of opening. */
    void add(Hold h) {
        h.order = ++order;
        if (h instanceof Reader r) {
            readers.put(h.id, r);
        } else {
            txs.put(h.id, (Transaction) h);
        }
    }

    /** Forgets a hold; the one forgotten, or null when none was open. */
    Hold remove(HoldKind kind, String id) {
        return of(kind).remove(id);
    }

    int readerCount() {
        return readers.size();
    }

    int txCount() {
        return txs.size();
    }

    /** The open holds of kind in the order they opened (a snapshot's). */
    List<Hold> inOrder(HoldKind kind) {
        List<Hold> hs = new ArrayList<>(of(kind).values());
        hs.sort(Comparator.comparingLong(h -> h.order));
        return hs;
    }

    /** The holds not yet published (all, or those below {@code below}), lowest ts first. */
    List<Hold> waiting(Long below) {
        List<Hold> ws = new ArrayList<>();
        for (HoldKind kind : HoldKind.values()) {
            for (Hold h : of(kind).values()) {
                if (!h.published && (below == null || h.ts < below)) {
                    ws.add(h);
                }
            }
        }
        ws.sort(Comparator.<Hold>comparingLong(h -> h.ts).thenComparing(h -> h.kind().wire()).thenComparing(h -> h.id));
        return ws;
    }

    /** A snapshot published every open hold. */
    void allPublished() {
        readers.values().forEach(h -> h.published = true);
        txs.values().forEach(h -> h.published = true);
    }

    /** Takes a directive's safe point (it only moves forward) and, when it carries them, the namespaces' bounds. */
    void observe(long safe, Long namespaceBase, Map<String, Long> namespaces) {
        if (safeTs == null || safe > safeTs) {
            safeTs = safe;
        }
        if (namespaceBase != null) {
            nsBase = namespaceBase;
            nsBounds = namespaces == null ? Map.of() : Map.copyOf(namespaces);
        }
    }

    /** The newest safe point the node learnt of (empty before the first). */
    OptionalLong safeTs() {
        return safeTs == null ? OptionalLong.empty() : OptionalLong.of(safeTs);
    }

    /**
     * The newest bound a hold of namespace is protected at, and whose it is: its namespace's, or for a hold without
     * one the highest of the safe point and every namespace's bound; null when none is known.
     */
    Bound boundOf(String namespace) {
        if (nsBase == null) {
            return safeTs == null ? null : new Bound(safeTs, "the cluster's safe point");
        }
        long own = nsBase;
        String whose = "a namespace's bound (a hold without a namespace pins every namespace)";
        if (namespace.isEmpty()) {
            for (long b : nsBounds.values()) {
                own = Math.max(own, b);
            }
        } else {
            whose = "the bound of namespace \"" + namespace + "\"";
            Long b = nsBounds.get(namespace);
            if (b != null) {
                own = b;
            }
        }
        if (safeTs != null && safeTs > own) {
            own = safeTs;
        }
        return new Bound(own, whose);
    }
}
