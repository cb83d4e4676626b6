package dev.safepoint.client;

import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.MessageDigest;
import java.security.PublicKey;
import java.security.Signature;
import java.security.spec.PKCS8EncodedKeySpec;
import java.security.spec.X509EncodedKeySpec;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

/**
 * The contract's signatures: a node event's {@code sig} with the node's own key (HMAC-SHA256), a control event's
 * with a control key, a hold's owner digest, and the job's Ed25519 signatures of directives.
 */
public final class Signing {
    static final String HMAC_PREFIX = "hmac-sha256:";
    static final String DIRECTIVE_PREFIX = "ed25519:";
    /** The fields a control event's signature covers (those the event has). */
    static final List<String> SIGNED_CONTROL_FIELDS = List.of("type", "cluster", "holder", "ts", "ttl_ms", "label",
            "reason", "gap", "action_id", "wall_ms", "owner", "owner_token", "force", "by");
    /** The DER prefix of an X.509 Ed25519 public key before its 32 raw bytes. */
    private static final byte[] ED25519_X509_PREFIX = HexFormat.of().parseHex("302a300506032b6570032100");

    private Signing() {}

    static String hmacHex(String key, byte[] body) {
        try {
            Mac mac = Mac.getInstance("HmacSHA256");
            mac.init(new SecretKeySpec(key.getBytes(StandardCharsets.UTF_8), "HmacSHA256"));
            return HexFormat.of().formatHex(mac.doFinal(body));
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException("HMAC-SHA256 is not available", e);
        }
    }

    /** A node event's sig with the node's own key: HMAC-SHA256 of every field but sig and log_ms. */
    public static String signNode(Map<String, Object> event, String key) {
        Map<String, Object> body = new LinkedHashMap<>(event);
        body.remove("sig");
        body.remove("log_ms");
        return HMAC_PREFIX + hmacHex(key, Json.canonical(body));
    }

    /** A control event's sig with a control key: HMAC-SHA256 of its signed fields. */
    public static String signControl(Map<String, Object> event, String key) {
        Map<String, Object> body = new LinkedHashMap<>();
        for (String k : SIGNED_CONTROL_FIELDS) {
            if (event.containsKey(k)) {
                body.put(k, event.get(k));
            }
        }
        return HMAC_PREFIX + hmacHex(key, Json.canonical(body));
    }

    /** A hold's owner as the control events carry it: the SHA-256 (hex) of its owner token. */
    public static String ownerDigest(String token) {
        try {
            return HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256")
                    .digest(token.getBytes(StandardCharsets.UTF_8)));
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException("SHA-256 is not available", e);
        }
    }

    /**
     * The job's public keys (64 hex digits each; a comma-separated list during a rotation) that directives must
     * be signed with. An IllegalArgumentException for anything else.
     */
    public static List<PublicKey> parseDirectiveKeys(String text) {
        List<PublicKey> keys = new ArrayList<>();
        for (String part : text.split(",", -1)) {
            part = part.strip();
            if (part.isEmpty()) {
                continue;
            }
            byte[] raw;
            try {
                raw = HexFormat.of().parseHex(part);
            } catch (IllegalArgumentException e) {
                raw = null;
            }
            if (raw == null || raw.length != 32) {
                throw new IllegalArgumentException(
                        "safepoint: a directive key is an Ed25519 public key of 64 hex digits, not \"" + part + "\"");
            }
            byte[] der = new byte[ED25519_X509_PREFIX.length + 32];
            System.arraycopy(ED25519_X509_PREFIX, 0, der, 0, ED25519_X509_PREFIX.length);
            System.arraycopy(raw, 0, der, ED25519_X509_PREFIX.length, 32);
            try {
                keys.add(KeyFactory.getInstance("Ed25519").generatePublic(new X509EncodedKeySpec(der)));
            } catch (GeneralSecurityException e) {
                throw new IllegalArgumentException("safepoint: not an Ed25519 public key: \"" + part + "\"", e);
            }
        }
        return keys;
    }

    /** The DER prefix of a PKCS#8 Ed25519 private key before its 32-byte seed. */
    private static final byte[] ED25519_PKCS8_PREFIX = HexFormat.of().parseHex("302e020100300506032b657004220420");

    /**
     * A directive's sig with the job's Ed25519 private key (64 hex digits, as safepoint directive-key makes it): the
     * job's signature of every other field (tests, and tools that write directives).
     */
    public static String signDirective(Map<String, Object> obj, String privateHex) {
        byte[] seed = HexFormat.of().parseHex(privateHex.strip());
        if (seed.length != 32) {
            throw new IllegalArgumentException("safepoint: a directive key is an Ed25519 private key of 64 hex digits");
        }
        byte[] der = new byte[ED25519_PKCS8_PREFIX.length + 32];
        System.arraycopy(ED25519_PKCS8_PREFIX, 0, der, 0, ED25519_PKCS8_PREFIX.length);
        System.arraycopy(seed, 0, der, ED25519_PKCS8_PREFIX.length, 32);
        Map<String, Object> body = new LinkedHashMap<>(obj);
        body.remove("sig");
        try {
            Signature s = Signature.getInstance("Ed25519");
            s.initSign(KeyFactory.getInstance("Ed25519").generatePrivate(new PKCS8EncodedKeySpec(der)));
            s.update(Json.canonical(body));
            return DIRECTIVE_PREFIX + HexFormat.of().formatHex(s.sign());
        } catch (GeneralSecurityException e) {
            throw new IllegalArgumentException("safepoint: cannot sign with that key: " + e, e);
        }
    }

    /** Why a directive is not signed by one of keys ("unsigned", "bad_signature"), or "" when it is. */
    public static String verifyDirective(Map<String, Object> obj, List<PublicKey> keys) {
        if (!(obj.get("sig") instanceof String sig) || !sig.startsWith(DIRECTIVE_PREFIX)) {
            return "unsigned";
        }
        byte[] raw;
        try {
            raw = HexFormat.of().parseHex(sig.substring(DIRECTIVE_PREFIX.length()));
        } catch (IllegalArgumentException e) {
            return "bad_signature";
        }
        Map<String, Object> body = new LinkedHashMap<>(obj);
        body.remove("sig");
        byte[] canonical;
        try {
            canonical = Json.canonical(body);
        } catch (IllegalArgumentException e) {
            return "bad_signature";
        }
        for (PublicKey key : keys) {
            try {
                Signature s = Signature.getInstance("Ed25519");
                s.initVerify(key);
                s.update(canonical);
                if (s.verify(raw)) {
                    return "";
                }
            } catch (GeneralSecurityException | IllegalArgumentException e) {
                // not this key's
            }
        }
        return "bad_signature";
    }
}
