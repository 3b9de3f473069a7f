package io.ragpulse.kafka;

import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.beam.sdk.expansion.ExternalTransformRegistrar;
import org.apache.beam.sdk.io.kafka.KafkaIO;
import org.apache.beam.sdk.io.kafka.KafkaRecord;
import org.apache.beam.sdk.schemas.Schema;
import org.apache.beam.sdk.transforms.DoFn;
import org.apache.beam.sdk.transforms.ExternalTransformBuilder;
import org.apache.beam.sdk.transforms.PTransform;
import org.apache.beam.sdk.transforms.ParDo;
import org.apache.beam.sdk.values.PBegin;
import org.apache.beam.sdk.values.PCollection;
import org.apache.beam.sdk.values.Row;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * The Kafka read of `ragpulse stream`: Beam's KafkaIO with {@link PartitionWatermarkPolicy}, each
 * record as a {@link Row} of {@link #RECORD_SCHEMA} (the fields of KafkaIO's cross-language read
 * that ragpulse uses), stamped with its Kafka record time. Offsets are committed when the runner
 * finalizes a checkpoint, when asked (a group.id is set). Which read KafkaIO runs (the legacy
 * UnboundedSource read or the splittable DoFn) is the expansion service's choice: deploy/flink
 * and the tests give it {@code --experiments=use_deprecated_read}.
 */
public final class ReadKafkaRecords extends PTransform<PBegin, PCollection<Row>> {

  public static final String URN = "beam:transform:io.ragpulse:kafka_read:v1";

  public static final Schema RECORD_SCHEMA =
      Schema.builder()
          .addStringField("topic")
          .addInt32Field("partition")
          .addInt64Field("offset")
          .addInt64Field("timestamp")
          .addNullableField("key", Schema.FieldType.BYTES)
          .addNullableField("value", Schema.FieldType.BYTES)
          .build();

  private final Configuration config;

  ReadKafkaRecords(Configuration config) {
    super("ReadKafkaRecords");
    this.config = config;
  }

  @Override
  public PCollection<Row> expand(PBegin begin) {
    KafkaIO.Read<byte[], byte[]> read =
        KafkaIO.<byte[], byte[]>read()
            .withConsumerConfigUpdates(new HashMap<String, Object>(config.consumerConfig))
            .withTopics(config.topics)
            .withKeyDeserializer(ByteArrayDeserializer.class)
            .withValueDeserializer(ByteArrayDeserializer.class)
            .withTimestampPolicyFactory(
                new PartitionWatermarkPolicy.Factory(
                    config.outOfOrdernessMillis, config.partitionIdleAfterMillis));
    if (config.commitOffsetInFinalize) {
      read = read.commitOffsetsInFinalize();
    }
    return begin
        .apply("ReadKafka", read)
        .apply("ToRecordRow", ParDo.of(new ToRecordRow()))
        .setRowSchema(RECORD_SCHEMA);
  }

  private static final class ToRecordRow extends DoFn<KafkaRecord<byte[], byte[]>, Row> {
    @ProcessElement
    public void processElement(
        @Element KafkaRecord<byte[], byte[]> record, OutputReceiver<Row> out) {
      out.output(
          Row.withSchema(RECORD_SCHEMA)
              .addValues(
                  record.getTopic(),
                  record.getPartition(),
                  record.getOffset(),
                  record.getTimestamp(),
                  record.getKV().getKey(),
                  record.getKV().getValue())
              .build());
    }
  }

  /**
   * What the Python side sends (pipeline/graphs/unbounded.py, `ReadKafkaStream`): the expansion
   * service sets each field from the payload's field of the same name in snake_case.
   */
  public static final class Configuration {
    Map<String, String> consumerConfig;
    List<String> topics;
    boolean commitOffsetInFinalize;
    long outOfOrdernessMillis;
    long partitionIdleAfterMillis;

    public void setConsumerConfig(Map<String, String> consumerConfig) {
      this.consumerConfig = consumerConfig;
    }

    public void setTopics(List<String> topics) {
      this.topics = topics;
    }

    public void setCommitOffsetInFinalize(Boolean commitOffsetInFinalize) {
      this.commitOffsetInFinalize = commitOffsetInFinalize;
    }

    public void setOutOfOrdernessMillis(Long outOfOrdernessMillis) {
      this.outOfOrdernessMillis = outOfOrdernessMillis;
    }

    public void setPartitionIdleAfterMillis(Long partitionIdleAfterMillis) {
      this.partitionIdleAfterMillis = partitionIdleAfterMillis;
    }
  }

  /** Builds the read from the payload. */
  public static final class Builder
      implements ExternalTransformBuilder<Configuration, PBegin, PCollection<Row>> {
    @Override
    public PTransform<PBegin, PCollection<Row>> buildExternal(Configuration config) {
      return new ReadKafkaRecords(config);
    }
  }

  /** Offers {@link #URN} to expansion services that have this jar on their classpath. */
  public static final class Registrar implements ExternalTransformRegistrar {
    @Override
    public Map<String, ExternalTransformBuilder<?, ?, ?>> knownBuilderInstances() {
      return Map.of(URN, new Builder());
    }
  }
}
