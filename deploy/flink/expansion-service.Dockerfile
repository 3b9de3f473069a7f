# Beam's Java IO expansion service, which expands ReadFromKafka for `ragpulse stream
# --expansion-service ragpulse-kafka-expansion:8097`; the Java reader it returns runs as a
# process in the TaskManagers (deploy/flink/flink.Dockerfile). Not built here (no Docker
# daemon, no Maven Central).
#
#   docker build -f deploy/flink/expansion-service.Dockerfile -t REGISTRY/ragpulse-kafka-expansion:2.70.0 .
FROM eclipse-temurin:17-jre
ADD https://repo.maven.apache.org/maven2/org/apache/beam/beam-sdks-java-io-expansion-service/2.70.0/beam-sdks-java-io-expansion-service-2.70.0.jar /opt/beam/expansion-service.jar
EXPOSE 8097
# Its flags are the container's args in jobserver.yaml (the cluster test runs the same ones).
ENTRYPOINT ["java", "-jar", "/opt/beam/expansion-service.jar"]
