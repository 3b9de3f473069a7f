# Beam's Flink job server (apache/beam_flink1.19_job_server:2.70.0) with ragpulse's Kafka read
# (java/kafka-read) AHEAD of Beam's jar on its classpath. The read's jar holds ragpulse's copy
# of Beam's Flink source wrapper (UnboundedSourceWrapper: no final watermark when Flink stops
# the job for a savepoint, so the open windows are in the savepoint). The job server builds the
# job with the first copy on its classpath and ships its classpath, in that order, as the job's
# jars: Flink's child-first class loading in the TaskManagers then loads ragpulse's copy too.
# Not built here (no Docker daemon).
#
#   docker build -f deploy/flink/jobserver.Dockerfile -t REGISTRY/ragpulse-flink-jobserver:2.70.0 .
FROM maven:3.9-eclipse-temurin-17 AS kafka-read
COPY java/kafka-read /src
RUN mvn -q -B -f /src/pom.xml package

FROM apache/beam_flink1.19_job_server:2.70.0
COPY --from=kafka-read /src/target/ragpulse-kafka-read.jar /opt/ragpulse/ragpulse-kafka-read.jar
# Beam's image runs `java -cp "jars/*"`: the order of a wildcard is not defined, so the
# classpath is spelled out. Its flags are the container's args in jobserver.yaml.
ENTRYPOINT ["java", "-cp", "/opt/ragpulse/ragpulse-kafka-read.jar:/opt/apache/beam/jars/beam-runners-flink-job-server.jar", "org.apache.beam.runners.flink.FlinkJobServerDriver"]
