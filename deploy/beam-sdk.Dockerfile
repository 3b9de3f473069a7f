# A Beam SDK worker image that can run ragpulse's graph (`--runner PortableRunner`, Flink,
# Dataflow's --sdk_container_image): the project image plus Beam's worker boot program.
# Not built on the development machine (no Docker daemon there); see README, "Running on other
# Beam runners". Python 3.11 and Beam 2.70.0 must match the launcher's.
#
#   docker build -f deploy/Dockerfile -t ragpulse .
#   docker build -f deploy/beam-sdk.Dockerfile -t REGISTRY/ragpulse-beam-sdk:TAG .
FROM ragpulse
USER root
COPY --from=apache/beam_python3.11_sdk:2.70.0 /opt/apache/beam /opt/apache/beam
ENTRYPOINT ["/opt/apache/beam/boot"]
