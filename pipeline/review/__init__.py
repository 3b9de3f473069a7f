"""`ragpulse review`: the review page over the review topic, and the labels it publishes
(docs/review.md). `queue` reads and publishes the topics; `app` is the page."""
