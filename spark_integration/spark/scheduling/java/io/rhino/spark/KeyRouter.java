package io.rhino.spark;

import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;

import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataTypes;

/**
 * Routing in the JVM: the shuffle token of a row's instance, computed from its grouping
 * key without a Python pass over the batch (rhino/spark/runtime/routing.py, which this
 * mirrors and which is the reference).
 *
 * A key's routing part is encode_key's bytes (state/encoding.py): per key column a type
 * tag and a big-endian body. Its key group is the top log2(K) bits of XXH3_64 of those
 * bytes with the job's seed (src/cpp/hashing/partitioner.cc), its vnode kg * V / K, and
 * the token is the one of the vnode's instance under the batch's routing table
 * (docs/design.md section 1).
 *
 * XXH3 comes from the copy of OpenHFT's zero-allocation-hashing that Parquet ships
 * (shaded) in Spark's jars, looked up by reflection so that this class compiles and loads
 * without it: {@link #available()} says whether it is there; the caller falls back to the
 * Python pass if not.
 */
public final class KeyRouter implements UDF1<Row, Long> {
    private static final long serialVersionUID = 1L;
    static final String HASH_CLASS = "shaded.parquet.net.openhft.hashing.LongHashFunction";

    // One tag per key column: 'i' integral, 's' string, 'b' binary, 'B' boolean.
    private final char[] kinds;
    private final long seed;
    private final int shift; // 64 - log2(K); 64 when K == 1
    private final long numKeyGroups;
    private final long numVnodes;
    private final long[] tokenOfVnode;
    private transient MethodHandle hash; // byte[] -> long, bound to xx3(seed)

    public KeyRouter(String kinds, long seed, int numKeyGroups, int numVnodes, long[] tokenOfVnode) {
        if (Integer.bitCount(numKeyGroups) != 1 || numVnodes < 1 || numVnodes > numKeyGroups
                || tokenOfVnode.length != numVnodes) {
            throw new IllegalArgumentException("bad routing table: K=" + numKeyGroups + " V=" + numVnodes
                    + " tokens=" + tokenOfVnode.length);
        }
        this.kinds = kinds.toCharArray();
        this.seed = seed;
        this.shift = 64 - Integer.numberOfTrailingZeros(numKeyGroups);
        this.numKeyGroups = numKeyGroups;
        this.numVnodes = numVnodes;
        this.tokenOfVnode = tokenOfVnode.clone();
    }

    /** Whether XXH3 is on this JVM's class path (Spark's Parquet jar). */
    public static boolean available() {
        try {
            xx3(0L);
            return true;
        } catch (ReflectiveOperationException | LinkageError e) {
            return false;
        }
    }

    private static MethodHandle xx3(long seed) throws ReflectiveOperationException {
        Class<?> c = Class.forName(HASH_CLASS, true, KeyRouter.class.getClassLoader());
        Object f = c.getMethod("xx3", long.class).invoke(null, seed);
        return MethodHandles.publicLookup()
                .findVirtual(c, "hashBytes", MethodType.methodType(long.class, byte[].class))
                .bindTo(f);
    }

    /** XXH3_64 of {@code bytes} with the job's seed (public for the test against the C++ one). */
    public long hash(byte[] bytes) {
        try {
            if (hash == null) {
                hash = xx3(seed);
            }
            return (long) hash.invokeExact(bytes);
        } catch (RuntimeException | Error e) {
            throw e;
        } catch (Throwable e) {
            throw new IllegalStateException("rhino.spark: XXH3 from " + HASH_CLASS + " failed", e);
        }
    }

    /** encode_key's bytes of the key columns of {@code r} (state/encoding.py, _component). */
    public byte[] encode(Row r) {
        int n = 0;
        for (int i = 0; i < kinds.length; i++) {
            n += 1 + (r.isNullAt(i) ? 0 : kinds[i] == 'i' ? 8 : kinds[i] == 'B' ? 0
                    : 8 + body(r, i).length);
        }
        ByteBuffer out = ByteBuffer.allocate(n); // big-endian, as encode_key's struct ">q"
        for (int i = 0; i < kinds.length; i++) {
            if (r.isNullAt(i)) {
                out.put((byte) 'n');
            } else if (kinds[i] == 'i') {
                out.put((byte) 'i').putLong(((Number) r.get(i)).longValue());
            } else if (kinds[i] == 'B') {
                out.put((byte) (r.getBoolean(i) ? 'T' : 'F'));
            } else {
                byte[] b = body(r, i);
                out.put((byte) kinds[i]).putLong(b.length).put(b);
            }
        }
        return out.array();
    }

    private byte[] body(Row r, int i) {
        return kinds[i] == 's' ? r.getString(i).getBytes(StandardCharsets.UTF_8) : (byte[]) r.get(i);
    }

    @Override
    public Long call(Row key) {
        long h = hash(encode(key));
        long kg = shift == 64 ? 0L : h >>> shift;
        return tokenOfVnode[(int) (kg * numVnodes / numKeyGroups)];
    }

    /**
     * {@code ds} with a non-null long column {@code name}: the token of each row's instance.
     * {@code kinds} has one tag per key column, in {@code keys}' order; {@code tokenOfVnode} is
     * the token of each vnode's instance.
     */
    public static Dataset<Row> withTokens(Dataset<Row> ds, String[] keys, String kinds, String name, long seed,
                                          int numKeyGroups, int numVnodes, byte[] tokenOfVnode) {
        // tokenOfVnode: numVnodes big-endian longs (one py4j argument, not a round trip each)
        long[] tokens = new long[tokenOfVnode.length / 8];
        ByteBuffer.wrap(tokenOfVnode).asLongBuffer().get(tokens);
        KeyRouter router = new KeyRouter(kinds, seed, numKeyGroups, numVnodes, tokens);
        Column[] cols = new Column[keys.length];
        for (int i = 0; i < keys.length; i++) {
            cols[i] = ds.col("`" + keys[i].replace("`", "``") + "`"); // a name, not an expression
        }
        Column token = functions.udf(router, DataTypes.LongType).asNonNullable().apply(functions.struct(cols));
        return ds.withColumn(name, token);
    }
}
