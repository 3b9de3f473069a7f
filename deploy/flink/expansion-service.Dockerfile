# Beam's Java IO expansion service with ragpulse's Kafka read (java/kafka-read) on its classpath,
# which expands the stream's read for `ragpulse stream --expansion-service
# ragpulse-kafka-expansion:8097`; the Java reader it returns runs in the TaskManagers
# (deploy/flink/flink.Dockerfile, which holds the same jar). Not built here (no Docker daemon).
#
#   docker build -f deploy/flink/expansion-service.Dockerfile -t REGISTRY/ragpulse-kafka-expansion:2.70.0 .
FROM maven:3.9-eclipse-temurin-17 AS kafka-read
COPY java/kafka-read /src
RUN mvn -q -B -f /src/pom.xml package

FROM eclipse-temurin:17-jre
ADD https://repo.maven.apache.org/maven2/org/apache/beam/beam-sdks-java-io-expansion-service/2.70.0/beam-sdks-java-io-expansion-service-2.70.0.jar /opt/beam/expansion-service.jar
COPY --from=kafka-read /src/target/ragpulse-kafka-read.jar /opt/beam/ragpulse-kafka-read.jar
EXPOSE 8097
# Its flags are the container's args in jobserver.yaml (the tests run the same ones).
ENTRYPOINT ["java", "-cp", "/opt/beam/expansion-service.jar:/opt/beam/ragpulse-kafka-read.jar", "org.apache.beam.sdk.expansion.service.ExpansionService"]
