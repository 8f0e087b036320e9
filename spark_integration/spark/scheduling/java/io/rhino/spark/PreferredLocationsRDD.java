package io.rhino.spark;

import java.util.ArrayList;
import java.util.List;

import org.apache.spark.Partition;
import org.apache.spark.TaskContext;
import org.apache.spark.rdd.RDD;

import scala.collection.Iterator;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;
import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;

/**
 * An RDD that is its parent, one partition to one, except that partition i prefers the
 * hosts {@code hosts.get(i)}: what Spark's own StateStoreRDD does to run a stateful task
 * where its state lives (docs/design.md section 8). The DAG scheduler takes preferred
 * locations from the first narrow ancestor that has them, so stages built on this RDD
 * with narrow transformations (mapPartitions, ...) inherit the pinning.
 *
 * Written in Java so that it compiles with plain javac against pyspark/jars/* (no Scala
 * compiler on a user's machine); rhino.spark.scheduling.jar builds the jar.
 */
public final class PreferredLocationsRDD<T> extends RDD<T> {
    private static final long serialVersionUID = 1L;

    // One String[] per partition. Plain arrays: serializable, and they do not keep the py4j
    // proxies of the caller's lists alive.
    private final String[][] hosts;

    @SuppressWarnings("unchecked")
    private static <T> ClassTag<T> anyTag() {
        // The element type is erased anyway: a PySpark RDD holds byte[] batches.
        return (ClassTag<T>) ClassTag$.MODULE$.AnyRef();
    }

    /**
     * @param parent the RDD to wrap (from PySpark: {@code rdd._jrdd.rdd()})
     * @param hostsPerPartition one host list per partition of the parent, in partition order;
     *        an empty list leaves that partition unpinned. A java.util.List, because py4j
     *        turns a Python list into one (not into an array).
     */
    public PreferredLocationsRDD(RDD<T> parent, List<? extends List<String>> hostsPerPartition) {
        super(parent, PreferredLocationsRDD.<T>anyTag());
        int n = parent.partitions().length;
        if (hostsPerPartition == null || hostsPerPartition.size() != n) {
            throw new IllegalArgumentException("PreferredLocationsRDD: " + n + " partitions but "
                + (hostsPerPartition == null ? "no" : String.valueOf(hostsPerPartition.size()))
                + " host lists; give exactly one (possibly empty) list per partition");
        }
        this.hosts = new String[n][];
        for (int i = 0; i < n; i++) {
            List<String> h = hostsPerPartition.get(i);
            this.hosts[i] = h == null ? new String[0] : new ArrayList<String>(h).toArray(new String[0]);
        }
    }

    @Override
    public Iterator<T> compute(Partition split, TaskContext context) {
        return this.<T>firstParent(PreferredLocationsRDD.<T>anyTag()).iterator(split, context);
    }

    @Override
    public Partition[] getPartitions() {
        return this.<T>firstParent(PreferredLocationsRDD.<T>anyTag()).partitions();
    }

    @Override
    public Seq<String> getPreferredLocations(Partition split) {
        List<String> h = java.util.Arrays.asList(hosts[split.index()]);
        return CollectionConverters.asScala(h).toList();
    }

    /** The host list of partition {@code index}, for checks from Python. */
    public List<String> preferredHosts(int index) {
        return java.util.Arrays.asList(hosts[index]);
    }
}
