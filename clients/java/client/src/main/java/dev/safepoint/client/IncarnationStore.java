package dev.safepoint.client;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;

/** Where a node's incarnation is kept across restarts (a file per cluster and node in a state dir). */
final class IncarnationStore {
    private IncarnationStore() {}

    /**
     * The wall clock in ms at start, or with a state dir one more than the last one kept there (whichever is
     * larger), kept for the next start.
     */
    static long next(Path dir, String cluster, String node, long now) {
        if (dir == null) {
            return now;
        }
        try {
            Files.createDirectories(dir);
            Path path = dir.resolve(escapePath(cluster) + "." + escapePath(node) + ".incarnation");
            long value = now;
            try {
                long last = Long.parseLong(Files.readString(path).strip());
                if (last + 1 > value) {
                    value = last + 1;
                }
            } catch (IOException | NumberFormatException e) {
                // none kept yet
            }
            Path tmp = dir.resolve(path.getFileName() + ".tmp");
            Files.writeString(tmp, value + "\n");
            Files.move(tmp, path, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
            return value;
        } catch (IOException e) {
            throw new SafepointException("safepoint: cannot keep the incarnation in " + dir + ": " + e, e);
        }
    }

    /** Quotes a name as Python's urllib.parse.quote(name, safe="") does, for the state file's name. */
    static String escapePath(String s) {
        StringBuilder b = new StringBuilder();
        for (byte c : s.getBytes(StandardCharsets.UTF_8)) {
            if (c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '.'
                    || c == '-' || c == '~') {
                b.append((char) c);
            } else {
                b.append('%').append(String.format("%02X", c & 0xff));
            }
        }
        return b.toString();
    }
}
