"""`ragpulse review`: serve the review page until stopped (docs/review.md).

The page reads the review topic that `serve` and `stream` publish to (--review-rate) and the
labels topic, and publishes each reviewer's labels there. It is served like /metrics: the TLS
and basic-auth users of --web-config-file (pipeline/metrics/http.py), by the same bounded
server; a login is required, since it names the reviewer on every label: basic auth, or a
bearer token of --bearer-token-file (pipeline/review/access.py). A review-topic record it
cannot show (over the item limit, or not an item) goes to REVIEW_TOPIC.dlq with its reason.
"""

from __future__ import annotations

import logging
import signal
import threading

from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.settings.models import ReviewSettings

log = logging.getLogger(__name__)


def main(settings: ReviewSettings) -> int:
    from ragpulse.pipeline.metrics.http import (
        BasicAuth,
        WebConfig,
        load_web_config,
        start_metrics_server,
    )
    from ragpulse.pipeline.review.access import AnyLogin, BearerTokens, Login
    from ragpulse.pipeline.review.app import review_app
    from ragpulse.pipeline.review.queue import LabelPublisher, ReviewQueue, dead_letter_publisher
    from ragpulse.pipeline.sinks.kafka import KafkaTopic

    web = WebConfig()
    if settings.web_config_file is not None:
        web = load_web_config(settings.web_config_file)
        if not web.users and settings.bearer_token_file is None:
            raise SettingsError(
                f"--web-config-file {settings.web_config_file}: the review page needs "
                "basic_auth_users or --bearer-token-file (a reviewer's login is the name on "
                "their labels)"
            )
    logins: list[Login] = [BasicAuth(web.users)] if web.users else []
    if settings.bearer_token_file is not None:
        logins.append(BearerTokens(settings.bearer_token_file))
    queue = ReviewQueue(
        settings.bootstrap, settings.kafka_security, settings.review_topic,
        settings.labels_topic, settings.kafka_timeout_seconds,
        dead_letter_publisher(KafkaTopic(
            settings.bootstrap, settings.kafka_security, settings.dead_letter_topic,
            settings.kafka_timeout_seconds,
        )),
    )
    publisher = LabelPublisher(KafkaTopic(
        settings.bootstrap, settings.kafka_security, settings.labels_topic,
        settings.kafka_timeout_seconds,
    ))
    app = review_app(queue, publisher, AnyLogin(*logins))
    queue.start()
    try:
        server = start_metrics_server(app, settings.host, settings.port, web.tls)
    except OSError as exc:
        queue.stop()
        raise SettingsError(f"cannot listen on {settings.host}:{settings.port}: {exc}") from None
    scheme = "https" if web.tls else "http"
    log.info(
        "review page on %s://%s:%d/ (%s): items from %s, labels to %s, items it cannot show "
        "to %s", scheme, settings.host, server.server_address[1],
        " and ".join(a for a, on in (("basic auth", bool(web.users)),
                                     ("bearer tokens", settings.bearer_token_file)) if on),
        settings.review_topic, settings.labels_topic, settings.dead_letter_topic,
    )
    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    stopped.wait()
    server.shutdown()
    server.server_close()
    queue.stop()
    publisher.close()
    return 0
