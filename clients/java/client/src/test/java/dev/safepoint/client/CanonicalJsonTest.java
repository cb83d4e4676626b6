package dev.safepoint.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

class CanonicalJsonTest {
    /**
     * An event whose canonical form exercises what JSON encoders differ in: key order across scripts (code point
     * order, as Python sorts), U+2028, an astral character, HTML characters, controls.
     */
    static Map<String, Object> tricky() {
        return Json.obj("v", 1, "type", "reader_open", "cluster", "c1", "node", "n1", "seq", 3,
                "reader_id", "r\u2028é\uD83D\uDE00/<>&\"\\\n\t\u0001\u007f", "ts", 100, "wall_ms", 1700000000000L,
                "groups", List.of("b", "a"), "label", null, "ok", true,
                "z", Json.obj("é", 1, "e", 2, "\uff01", 3, "\uD83D\uDE00", 4));
    }

    /** Python's json.dumps(tricky, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(). */
    static final String TRICKY_CANONICAL = "7b22636c7573746572223a226331222c2267726f757073223a5b2262222c2261225d2c226c6162656c223a6e756c6c2c"
            + "226e6f6465223a226e31222c226f6b223a747275652c227265616465725f6964223a2272e280a8c3a9f09f98802f3c3e265c225c5c5c6e5c74"
            + "5c75303030317f222c22736571223a332c227473223a3130302c2274797065223a227265616465725f6f70656e222c2276223a312c227761"
            + "6c6c5f6d73223a313730303030303030303030302c227a223a7b2265223a322c22c3a9223a312c22efbc81223a332c22f09f9880223a347d7d";

    @Test
    void canonicalFormIsPythons() {
        assertEquals(TRICKY_CANONICAL, HexFormat.of().formatHex(Json.canonical(tricky())));
    }

    @Test
    void keysSortByCodePointNotUtf16Unit() {
        // U+FF01 is one UTF-16 unit above the surrogates of U+1F600, but its code point is below
        assertTrue(Json.CODE_POINT_ORDER.compare("\uff01", "\uD83D\uDE00") < 0);
        assertTrue("\uff01".compareTo("\uD83D\uDE00") > 0);
        assertEquals("{\"a\":1,\"ab\":2,\"b\":3}", Json.canonicalString(Json.obj("b", 3, "ab", 2, "a", 1)));
    }

    @Test
    void escapesAsPython() {
        assertEquals("\"\\b\\f\\u001f\u2029\u007f\"", Json.canonicalString("\b\f\u001f\u2029\u007f"));
    }

    @Test
    void parseKeepsNumbersAsWritten() throws Exception {
        Map<String, Object> obj = Json.parseObject("{\"safe_ts\":9007199254740993,\"seq\":1,\"big\":123456789012345678901234567890,\"f\":1.50}"
                .getBytes(StandardCharsets.UTF_8));
        assertEquals("{\"big\":123456789012345678901234567890,\"f\":1.50,\"safe_ts\":9007199254740993,\"seq\":1}",
                Json.canonicalString(obj));
    }
}
