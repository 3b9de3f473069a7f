package io.ragpulse.kafka;

import java.io.Serializable;
import java.util.Optional;
import org.apache.beam.sdk.io.kafka.KafkaRecord;
import org.apache.beam.sdk.io.kafka.TimestampPolicy;
import org.apache.beam.sdk.io.kafka.TimestampPolicyFactory;
import org.apache.beam.sdk.transforms.windowing.BoundedWindow;
import org.apache.kafka.common.TopicPartition;
import org.joda.time.Duration;
import org.joda.time.Instant;

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
 */
public final class PartitionWatermarkPolicy extends TimestampPolicy<byte[], byte[]> {

  private final Duration outOfOrderness;
  private final Duration idleAfter;
  private Instant latestRecordTime = BoundedWindow.TIMESTAMP_MIN_VALUE;
  private Instant watermark;
  private Instant lastBusy; // wall clock: the last time the partition had a backlog or a record

  PartitionWatermarkPolicy(
      Duration outOfOrderness, Duration idleAfter, Optional<Instant> previousWatermark, Instant now) {
    this.outOfOrderness = outOfOrderness;
    this.idleAfter = idleAfter;
    this.watermark = previousWatermark.orElse(BoundedWindow.TIMESTAMP_MIN_VALUE);
    this.lastBusy = now;
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
    boolean idle = backlog == 0 && !now.isBefore(lastBusy.plus(idleAfter));
    if (idle && backlogCheckTime.minus(outOfOrderness).isAfter(candidate)) {
      candidate = backlogCheckTime.minus(outOfOrderness);
    }
    if (candidate.isAfter(watermark)) {
      watermark = candidate;
    }
    return watermark;
  }

  /** Makes one {@link PartitionWatermarkPolicy} per partition a reader reads. */
  public static final class Factory
      implements TimestampPolicyFactory<byte[], byte[]>, Serializable {
    private static final long serialVersionUID = 1L;
    private final long outOfOrdernessMillis;
    private final long idleAfterMillis;

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
    public TimestampPolicy<byte[], byte[]> createTimestampPolicy(
        TopicPartition tp, Optional<Instant> previousWatermark) {
      return new PartitionWatermarkPolicy(
          Duration.millis(outOfOrdernessMillis),
          Duration.millis(idleAfterMillis),
          previousWatermark,
          Instant.now());
    }
  }
}
