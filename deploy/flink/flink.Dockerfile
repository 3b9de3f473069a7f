# Flink for ragpulse's stream: Flink 1.19 plus Beam's Java SDK harness, which the TaskManagers
# start as a process to run the Java stages of the Kafka read (the expansion service asks for
# PROCESS with /opt/apache/beam/boot), and ragpulse's Kafka read (java/kafka-read) in Flink's
# lib/: the legacy read runs inside the TaskManager's JVM, where its timestamp policy must load.
# Not built here (no Docker daemon).
#
#   docker build -f deploy/flink/flink.Dockerfile -t REGISTRY/ragpulse-flink:1.19-beam2.70.0 .
FROM maven:3.9-eclipse-temurin-17 AS kafka-read
COPY java/kafka-read /src
RUN mvn -q -B -f /src/pom.xml package

FROM flink:1.19-java11
COPY --from=apache/beam_java11_sdk:2.70.0 /opt/apache/beam /opt/apache/beam
COPY --from=kafka-read /src/target/ragpulse-kafka-read.jar /opt/flink/lib/ragpulse-kafka-read.jar
