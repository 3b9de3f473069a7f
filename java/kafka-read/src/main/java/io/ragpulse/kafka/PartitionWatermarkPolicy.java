package io.ragpulse.kafka;

import java.io.Serializable;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.beam.sdk.io.kafka.KafkaRecord;
import org.apache.beam.sdk.io.kafka.TimestampPolicy;
import org.apache.beam.sdk.io.kafka.TimestampPolicyFactory;
import org.apache.beam.sdk.transforms.windowing.BoundedWindow;
import org.apache.kafka.common.TopicPartition;
import org.joda.time.Duration;
import org.joda.time.Instant;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The event time and watermark of one Kafka partition in `ragpulse stream`, kept as serve keeps
 * them (pipeline/service/watermark.py): a record's event time is its Kafka record time; the
 * partition's watermark is the latest record time read minus {@code outOfOrderness}; a partition
 * that has had nothing to read for {@code idleAfter} is idle and stops holding the watermark back.
 *
 * <p>Why not KafkaIO's CreateTime policy ({@code CustomTimestampPolicyWithLimitedDelay}, zero
 * delay, the only one its cross-language read builds): a partition that never received a record
 * holds the job's watermark at the beginning of time (no on-time pane ever), and a partition
 * that is caught up moves its watermark to the time of the last end-offset check at once, with no
 * grace, so a producer that pauses between two writes sees its next records late.
 *
 * <p>Idle: the end offset checked at {@code ctx.getBacklogCheckTime()} had been read (backlog 0)
 * and the partition has had no backlog and returned no record for {@code idleAfter} (counted from
 * the reader's start, like serve). Its watermark is then that check's time minus {@code
 * outOfOrderness}: a record appended after the check is expected to carry a record time after it,
 * less the same bound; one that does not is late, as in serve. The watermark never moves back.
 *
 * <p>Both of KafkaIO's reads use it. The legacy read (Flink) makes one policy per partition when a
 * reader starts or is restored. The splittable read (Dataflow) makes one each time it resumes a
 * partition, every poll that returns nothing, with the watermark it had reached: the {@link
 * Factory} then hands back the partition's previous policy, so that the time since the partition
 * was last busy adds up across polls (else it would never become idle).
 */
public final class PartitionWatermarkPolicy extends TimestampPolicy<byte[], byte[]> {

  private static final Logger LOG = LoggerFactory.getLogger(PartitionWatermarkPolicy.class);
  private static final Duration STATUS_EVERY = Duration.standardSeconds(30);

  private final TopicPartition partition;
  private boolean idle;
  private Instant lastStatus = BoundedWindow.TIMESTAMP_MIN_VALUE;

  private final Duration outOfOrderness;
  private final Duration idleAfter;
  private Instant latestRecordTime = BoundedWindow.TIMESTAMP_MIN_VALUE;
  private Instant watermark;
  private Instant lastBusy; // wall clock: the last time the partition had a backlog or a record

  PartitionWatermarkPolicy(
      TopicPartition partition,
      Duration outOfOrderness,
      Duration idleAfter,
      Optional<Instant> previousWatermark,
      Instant now) {
    this.partition = partition;
    this.outOfOrderness = outOfOrderness;
    this.idleAfter = idleAfter;
    this.watermark = previousWatermark.orElse(BoundedWindow.TIMESTAMP_MIN_VALUE);
    this.lastBusy = now;
    LOG.info(
        "{}: watermark from {} (restored: {}), out-of-orderness {}, idle after {}",
        partition,
        watermark,
        previousWatermark.isPresent(),
        outOfOrderness,
        idleAfter);
  }

  @Override
  public Instant getTimestampForRecord(PartitionContext ctx, KafkaRecord<byte[], byte[]> record) {
    Instant recordTime = new Instant(record.getTimestamp());
    if (recordTime.isAfter(latestRecordTime)) {
      latestRecordTime = recordTime;
    }
    lastBusy = Instant.now();
    return recordTime;
  }

  @Override
  public Instant getWatermark(PartitionContext ctx) {
    return watermarkAt(ctx.getMessageBacklog(), ctx.getBacklogCheckTime(), Instant.now());
  }

  /** The watermark at wall-clock time {@code now}, given the last end-offset check's result. */
  Instant watermarkAt(long backlog, Instant backlogCheckTime, Instant now) {
    if (backlog != 0) { // records left to read, or not known yet (-1)
      lastBusy = now;
    }
    Instant candidate =
        latestRecordTime.isAfter(BoundedWindow.TIMESTAMP_MIN_VALUE)
            ? latestRecordTime.minus(outOfOrderness)
            : BoundedWindow.TIMESTAMP_MIN_VALUE;
    boolean nowIdle = backlog == 0 && !now.isBefore(lastBusy.plus(idleAfter));
    if (nowIdle != idle) {
      idle = nowIdle;
      LOG.info(
          "{}: {} (backlog {} at {}, latest record time {}, watermark {})",
          partition,
          idle ? "idle: the watermark follows the end-offset checks" : "busy again",
          backlog,
          backlogCheckTime,
          latestRecordTime,
          watermark);
    }
    if (idle && backlogCheckTime.minus(outOfOrderness).isAfter(candidate)) {
      candidate = backlogCheckTime.minus(outOfOrderness);
    }
    if (candidate.isAfter(watermark)) {
      watermark = candidate;
    }
    if (LOG.isDebugEnabled() && !now.isBefore(lastStatus.plus(STATUS_EVERY))) {
      lastStatus = now;
      LOG.debug(
          "{}: backlog {} at {}, latest record time {}, last busy {}, watermark {}",
          partition,
          backlog,
          backlogCheckTime,
          latestRecordTime,
          lastBusy,
          watermark);
    }
    return watermark;
  }

  /**
   * Makes the {@link PartitionWatermarkPolicy} of each partition a reader reads; a policy asked
   * for again with the watermark its partition's last policy reached (the splittable read
   * resuming) is that policy, which goes on.
   */
  public static final class Factory
      implements TimestampPolicyFactory<byte[], byte[]>, Serializable {
    private static final long serialVersionUID = 1L;
    private final long outOfOrdernessMillis;
    private final long idleAfterMillis;
    // The latest policy made for each partition by this (deserialized) factory.
    private transient Map<TopicPartition, PartitionWatermarkPolicy> latest;

    public Factory(long outOfOrdernessMillis, long idleAfterMillis) {
      if (outOfOrdernessMillis < 0 || idleAfterMillis < 0) {
        throw new IllegalArgumentException(
            "out-of-orderness and idle-after must not be negative, got "
                + outOfOrdernessMillis
                + " ms and "
                + idleAfterMillis
                + " ms");
      }
      this.outOfOrdernessMillis = outOfOrdernessMillis;
      this.idleAfterMillis = idleAfterMillis;
    }

    @Override
    public synchronized TimestampPolicy<byte[], byte[]> createTimestampPolicy(
        TopicPartition tp, Optional<Instant> previousWatermark) {
      if (latest == null) {
        latest = new ConcurrentHashMap<>();
      }
      PartitionWatermarkPolicy before = latest.get(tp);
      if (before != null
          && previousWatermark.isPresent()
          && before.watermark.equals(previousWatermark.get())) {
        return before; // the same partition resumed where its policy was
      }
      PartitionWatermarkPolicy policy =
          new PartitionWatermarkPolicy(
              tp,
              Duration.millis(outOfOrdernessMillis),
              Duration.millis(idleAfterMillis),
              previousWatermark,
              Instant.now());
      latest.put(tp, policy);
      return policy;
    }
  }
}
