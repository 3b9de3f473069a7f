# Flink for ragpulse's stream: Flink 1.19 plus Beam's Java SDK harness, which the TaskManagers
# start as a process to run the Java Kafka reader (the expansion service asks for
# PROCESS with /opt/apache/beam/boot). Not built here (no Docker daemon).
#
#   docker build -f deploy/flink/flink.Dockerfile -t REGISTRY/ragpulse-flink:1.19-beam2.70.0 .
FROM flink:1.19-java11
COPY --from=apache/beam_java11_sdk:2.70.0 /opt/apache/beam /opt/apache/beam
