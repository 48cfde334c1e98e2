package example.outbox;

import java.security.SecureRandom;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.sql.Types;
import java.util.HexFormat;

/**
 * Commits an order and its events through the transactional outbox (JDBC, pgjdbc).
 *
 * <p>Usage: {@code DATABASE_URL=postgresql://... [TRACEPARENT=00-...] java example.outbox.Writer ORDER_ID}
 */
public final class Writer {
    private static final SecureRandom RANDOM = new SecureRandom();
    // jsonb_strip_nulls drops amount_cents and tracestate when they are not given.
    private static final String PAYLOAD = "jsonb_strip_nulls(jsonb_build_object('order_id', ?::text,"
            + " 'amount_cents', ?::integer))";
    private static final String HEADERS = "jsonb_strip_nulls(jsonb_build_object('traceparent', ?::text,"
            + " 'tracestate', ?::text))";
    private static final String INSERT_EVENT = "INSERT INTO outbox_events (topic, aggregate_id, payload, headers)"
            + " VALUES (?, ?, " + PAYLOAD + ", " + HEADERS + ") RETURNING id";
    private static final String PUBLISH_EVENT = "SELECT outbox_publish(?, ?, " + PAYLOAD + ", " + HEADERS + ")";

    static final class PaymentDeclined extends Exception {
        private static final long serialVersionUID = 1L;

        PaymentDeclined(String message) {
            super(message);
        }
    }

    private Writer() {}

    public static void main(String[] args) throws SQLException {
        String orderId = args.length > 0 ? args[0] : "order-" + randomHex(4);
        String traceparent = System.getenv("TRACEPARENT");
        if (traceparent == null || traceparent.isEmpty()) {
            traceparent = "00-" + randomHex(16) + "-" + randomHex(8) + "-01"; // a new trace
        }
        String tracestate = System.getenv("TRACESTATE"); // may be null: then no tracestate header
        try (Connection conn = DriverManager.getConnection(jdbcUrl(System.getenv("DATABASE_URL")))) {
            try (Statement st = conn.createStatement()) {
                st.execute("CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, status text NOT NULL,"
                        + " amount_cents integer NOT NULL)");
            }
            conn.setAutoCommit(false);

            // One transaction: the business row and its event commit together or not at all.
            try {
                update(conn, "INSERT INTO orders (id, status, amount_cents) VALUES (?, 'placed', 1999)", orderId);
                long id = insertEvent(conn, INSERT_EVENT, "order.placed", orderId, 1999, traceparent, tracestate);
                conn.commit();
                System.out.println("committed order.placed id=" + id);
            } catch (SQLException e) {
                conn.rollback();
                throw e;
            }

            // The same with the convenience function, which returns the event id.
            try {
                update(conn, "UPDATE orders SET status = 'paid' WHERE id = ?", orderId);
                long id = insertEvent(conn, PUBLISH_EVENT, "order.paid", orderId, null, traceparent, tracestate);
                conn.commit();
                System.out.println("committed order.paid id=" + id);
            } catch (SQLException e) {
                conn.rollback();
                throw e;
            }

            // A failure after the INSERT rolls back the business change and the event: nothing is sent.
            long id = 0;
            try {
                update(conn, "UPDATE orders SET status = 'cancelled' WHERE id = ?", orderId);
                id = insertEvent(conn, INSERT_EVENT, "order.cancelled", orderId, null, traceparent, tracestate);
                throw new PaymentDeclined("refund refused by the payment provider");
            } catch (PaymentDeclined e) {
                conn.rollback();
                System.out.println("rolled back order.cancelled id=" + id + ": " + e.getMessage());
            } catch (SQLException e) {
                conn.rollback();
                throw e;
            }
        }
    }

    /** postgresql://user:pass@host:port/db?params, as libpq takes it, to pgjdbc's form. */
    static String jdbcUrl(String url) {
        if (url == null || url.isEmpty()) {
            throw new IllegalArgumentException("set DATABASE_URL, e.g. postgresql://app@localhost:5432/app");
        }
        if (url.startsWith("jdbc:")) {
            return url;
        }
        java.net.URI uri = java.net.URI.create(url.replaceFirst("^postgres(ql)?:", "postgresql:"));
        StringBuilder jdbc = new StringBuilder("jdbc:postgresql://").append(uri.getHost());
        if (uri.getPort() > 0) {
            jdbc.append(':').append(uri.getPort());
        }
        jdbc.append(uri.getRawPath());
        String sep = "?";
        if (uri.getRawQuery() != null) {
            jdbc.append('?').append(uri.getRawQuery());
            sep = "&";
        }
        if (uri.getRawUserInfo() != null) {
            String[] userPass = uri.getRawUserInfo().split(":", 2);
            jdbc.append(sep).append("user=").append(userPass[0]);
            if (userPass.length > 1) {
                jdbc.append("&password=").append(userPass[1]);
            }
        }
        return jdbc.toString();
    }

    private static void update(Connection conn, String sql, String param) throws SQLException {
        try (PreparedStatement ps = conn.prepareStatement(sql)) {
            ps.setString(1, param);
            ps.executeUpdate();
        }
    }

    /**
     * Inserts one event and returns its id. Postgres builds the JSON (no JSON library needed here; an
     * application would bind its own JSON text as {@code ?::jsonb}). The headers carry the caller's W3C trace
     * context: in a service, take it from the current span (OpenTelemetry: the propagator's inject).
     */
    private static long insertEvent(Connection conn, String sql, String topic, String orderId, Integer amountCents,
            String traceparent, String tracestate) throws SQLException {
        try (PreparedStatement ps = conn.prepareStatement(sql)) {
            ps.setString(1, topic);
            ps.setString(2, orderId);
            ps.setString(3, orderId);
            if (amountCents == null) {
                ps.setNull(4, Types.INTEGER);
            } else {
                ps.setInt(4, amountCents);
            }
            ps.setString(5, traceparent);
            ps.setString(6, tracestate);
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                return rs.getLong(1);
            }
        }
    }

    private static String randomHex(int bytes) {
        byte[] b = new byte[bytes];
        RANDOM.nextBytes(b);
        return HexFormat.of().formatHex(b);
    }
}
