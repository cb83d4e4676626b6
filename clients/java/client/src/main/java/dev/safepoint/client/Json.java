package dev.safepoint.client;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.core.StreamReadConstraints;
import java.io.IOException;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * JSON as the wire contract has it. {@link #canonical} writes a value as compact UTF-8 JSON, the objects' keys
 * sorted by Unicode code point and nothing escaped but what JSON must escape, equal to Python's
 * {@code json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False)}: the form signatures are
 * taken over. {@link #parse} reads JSON into maps, lists, strings, booleans, null and numbers kept as written
 * (integers as {@link Long} or {@link BigInteger}, others as {@link Number} whose text is the one read), so that
 * a directive's canonical form is the one its signer took.
 */
public final class Json {
    private static final JsonFactory FACTORY = JsonFactory.builder()
            .streamReadConstraints(StreamReadConstraints.builder().maxNumberLength(10_000).build()).build();

    /** Keys in Unicode code point order (Python's sort), not UTF-16 unit order. */
    public static final Comparator<String> CODE_POINT_ORDER = Json::compareCodePoints;

    private Json() {}

    /** A number that is not an integer, kept as its text was written. */
    public static final class Num extends Number {
        private final String text;

        public Num(String text) {
            this.text = text;
        }

        @Override public int intValue() { return (int) doubleValue(); }
        @Override public long longValue() { return (long) doubleValue(); }
        @Override public float floatValue() { return (float) doubleValue(); }
        @Override public double doubleValue() { return Double.parseDouble(text); }
        @Override public String toString() { return text; }
        @Override public boolean equals(Object o) { return o instanceof Num n && n.text.equals(text); }
        @Override public int hashCode() { return text.hashCode(); }
    }

    static int compareCodePoints(String a, String b) {
        int i = 0;
        int j = 0;
        while (i < a.length() && j < b.length()) {
            int ca = a.codePointAt(i);
            int cb = b.codePointAt(j);
            if (ca != cb) {
                return Integer.compare(ca, cb);
            }
            i += Character.charCount(ca);
            j += Character.charCount(cb);
        }
        return Integer.compare(a.length() - i, b.length() - j);
    }

    /** The canonical form of {@code value} as UTF-8 bytes. */
    public static byte[] canonical(Object value) {
        return canonicalString(value).getBytes(StandardCharsets.UTF_8);
    }

    /** The canonical form of {@code value}. */
    public static String canonicalString(Object value) {
        StringBuilder sb = new StringBuilder(128);
        write(sb, value);
        return sb.toString();
    }

    @SuppressWarnings("unchecked")
    private static void write(StringBuilder sb, Object v) {
        if (v == null) {
            sb.append("null");
        } else if (v instanceof String s) {
            quote(sb, s);
        } else if (v instanceof Boolean b) {
            sb.append(b ? "true" : "false");
        } else if (v instanceof Long || v instanceof Integer || v instanceof Short || v instanceof Byte
                || v instanceof BigInteger || v instanceof Num) {
            sb.append(v.toString());
        } else if (v instanceof BigDecimal d) {
            sb.append(d.toString());
        } else if (v instanceof Double || v instanceof Float) {
            double d = ((Number) v).doubleValue();
            if (d == Math.rint(d) && !Double.isInfinite(d) && Math.abs(d) < 1e16) {
                sb.append((long) d).append(".0"); // Python's repr of an integral float
            } else {
                sb.append(v.toString());
            }
        } else if (v instanceof Map<?, ?> m) {
            Object[] keys = m.keySet().toArray();
            String[] names = new String[keys.length];
            for (int i = 0; i < keys.length; i++) {
                names[i] = String.valueOf(keys[i]);
            }
            Arrays.sort(names, CODE_POINT_ORDER);
            sb.append('{');
            for (int i = 0; i < names.length; i++) {
                if (i > 0) {
                    sb.append(',');
                }
                quote(sb, names[i]);
                sb.append(':');
                write(sb, ((Map<Object, Object>) m).get(names[i]));
            }
            sb.append('}');
        } else if (v instanceof Collection<?> c) {
            sb.append('[');
            boolean first = true;
            for (Object o : c) {
                if (!first) {
                    sb.append(',');
                }
                first = false;
                write(sb, o);
            }
            sb.append(']');
        } else if (v instanceof Object[] a) {
            write(sb, Arrays.asList(a));
        } else if (v instanceof long[] a) {
            List<Long> list = new ArrayList<>(a.length);
            for (long x : a) {
                list.add(x);
            }
            write(sb, list);
        } else {
            throw new IllegalArgumentException("safepoint: cannot encode a " + v.getClass().getName() + " as JSON");
        }
    }

    private static final char[] HEX = "0123456789abcdef".toCharArray();

    private static void quote(StringBuilder sb, String s) {
        sb.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"' -> sb.append("\\\"");
                case '\\' -> sb.append("\\\\");
                case '\n' -> sb.append("\\n");
                case '\r' -> sb.append("\\r");
                case '\t' -> sb.append("\\t");
                case '\b' -> sb.append("\\b");
                case '\f' -> sb.append("\\f");
                default -> {
                    if (c < 0x20) {
                        sb.append("\\u00").append(HEX[c >> 4]).append(HEX[c & 0xf]);
                    } else {
                        sb.append(c);
                    }
                }
            }
        }
        sb.append('"');
    }

    /** Reads one JSON value (an object's keys in the order written). */
    public static Object parse(byte[] raw) throws IOException {
        try (JsonParser p = FACTORY.createParser(raw)) {
            return parseAll(p);
        }
    }

    /** Reads one JSON value from text. */
    public static Object parse(String text) throws IOException {
        try (JsonParser p = FACTORY.createParser(text)) {
            return parseAll(p);
        }
    }

    /** Reads one JSON object; an IOException when it is not one. */
    @SuppressWarnings("unchecked")
    public static Map<String, Object> parseObject(byte[] raw) throws IOException {
        Object v = parse(raw);
        if (!(v instanceof Map)) {
            throw new IOException("not a JSON object");
        }
        return (Map<String, Object>) v;
    }

    /** Reads one JSON object from text; an IOException when it is not one. */
    @SuppressWarnings("unchecked")
    public static Map<String, Object> parseObject(String text) throws IOException {
        Object v = parse(text);
        if (!(v instanceof Map)) {
            throw new IOException("not a JSON object");
        }
        return (Map<String, Object>) v;
    }

    private static Object parseAll(JsonParser p) throws IOException {
        JsonToken t = p.nextToken();
        if (t == null) {
            throw new IOException("no JSON value");
        }
        Object v = value(p, t);
        if (p.nextToken() != null) {
            throw new IOException("more than one JSON value");
        }
        return v;
    }

    private static Object value(JsonParser p, JsonToken t) throws IOException {
        switch (t) {
            case START_OBJECT: {
                Map<String, Object> m = new LinkedHashMap<>();
                for (JsonToken k = p.nextToken(); k != JsonToken.END_OBJECT; k = p.nextToken()) {
                    String name = p.currentName();
                    m.put(name, value(p, p.nextToken()));
                }
                return m;
            }
            case START_ARRAY: {
                List<Object> l = new ArrayList<>();
                for (JsonToken k = p.nextToken(); k != JsonToken.END_ARRAY; k = p.nextToken()) {
                    l.add(value(p, k));
                }
                return l;
            }
            case VALUE_STRING:
                return p.getText();
            case VALUE_NUMBER_INT: {
                String text = p.getText();
                try {
                    return Long.parseLong(text);
                } catch (NumberFormatException e) {
                    return new BigInteger(text);
                }
            }
            case VALUE_NUMBER_FLOAT:
                return new Num(p.getText());
            case VALUE_TRUE:
                return Boolean.TRUE;
            case VALUE_FALSE:
                return Boolean.FALSE;
            case VALUE_NULL:
                return null;
            default:
                throw new IOException("unexpected JSON token " + t);
        }
    }

    // -- reading fields of a parsed object

    /** The integer at {@code v}, or null when it is none. */
    public static Long integer(Object v) {
        if (v instanceof Long l) {
            return l;
        }
        if (v instanceof Integer i) {
            return i.longValue();
        }
        if (v instanceof Num n) {
            try {
                double d = n.doubleValue();
                if (d == Math.rint(d) && Math.abs(d) < 9.2e18) {
                    return (long) d;
                }
            } catch (NumberFormatException e) {
                return null;
            }
        }
        return null;
    }

    /** The string at {@code v}, or "" when it is none. */
    public static String str(Object v) {
        return v instanceof String s ? s : "";
    }

    /** An object of fields in order: {@code obj("a", 1, "b", 2)}. */
    public static Map<String, Object> obj(Object... kv) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int i = 0; i + 1 < kv.length; i += 2) {
            m.put((String) kv[i], kv[i + 1]);
        }
        return m;
    }
}
