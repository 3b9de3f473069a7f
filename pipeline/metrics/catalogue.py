"""Every Prometheus metric ragpulse exports: its name, and its help text, in one place.

The stages, the serve loop and the cost controls count under these names
(`pipeline.metrics.counting.key(EVENTS, outcome="accepted")`); the collector
(`pipeline.metrics.collector`) exports them with the help texts below; the Prometheus rules and
dashboards are checked against `ALL_NAMES` (tests/test_metrics_catalogue.py). A separate module
rather than part of `pipeline.metrics.counting`: this is data that the collector, the rule checks
and the counting code all read, while `counting` is the codec of counter keys that Beam workers use;
neither needs the other's imports. Pure data: no imports of ragpulse, so any layer may read it.
"""

from __future__ import annotations

from typing import Literal, get_args

PREFIX = "ragpulse_"

# -- counters (`_total`), counted through pipeline.metrics.counting keys
# ---------------------------------
EVENTS = "ragpulse_events_total"
EVENTS_SAMPLED = "ragpulse_events_sampled_total"
EVENTS_JUDGED = "ragpulse_events_judged_total"
LATE_EVENTS = "ragpulse_late_events_total"
DEAD_LETTERS = "ragpulse_dead_letters_total"
VERDICTS = "ragpulse_judge_verdicts_total"
JUDGE_CALLS = "ragpulse_judge_calls_total"
CACHE_HITS = "ragpulse_judge_cache_hits_total"
JUDGE_ERRORS = "ragpulse_judge_errors_total"
# Verdicts of ensembles (judges.llm.ensemble) by their members' agreement.
ENSEMBLE_VOTES = "ragpulse_judge_ensemble_votes_total"
# Judges not run on an event that lacks their required field (`missing`: the input names).
SKIPPED = "ragpulse_judge_skipped_total"
TOKENS = "ragpulse_judge_tokens_total"
PROMPT_CHARS_CUT = "ragpulse_judge_prompt_chars_cut_total"
RETRIEVED_CHUNKS = "ragpulse_retrieved_chunks_total"
WITHOUT_CONTEXT = "ragpulse_events_without_context_total"
# Groundedness verdicts by the context_sufficiency verdict of the same answer.
GROUNDED_BY_CONTEXT = "ragpulse_groundedness_by_context_total"
CANARY_VERDICTS = "ragpulse_canary_verdicts_total"
# Its `outcome` label: a canary's verdict against the human label.
CanaryOutcome = Literal["agree", "disagree", "error"]
CANARY_OUTCOMES: tuple[CanaryOutcome, ...] = get_args(CanaryOutcome)
OFFSET_RESETS = "ragpulse_offset_resets_total"
RECORDS_LOST = "ragpulse_records_lost_total"
UNDELIVERABLE = "ragpulse_dead_letters_undeliverable_total"
LABEL_OVERFLOW = "ragpulse_label_overflow_total"
# The chatbot's own cost, per app and model (pipeline.formats.events.AgentUsage), for every accepted
# event: Agent Evaluation's agent/input_token_count, output and total.
AGENT_INPUT_TOKENS = "ragpulse_agent_input_tokens_total"
AGENT_OUTPUT_TOKENS = "ragpulse_agent_output_tokens_total"
AGENT_TOTAL_TOKENS = "ragpulse_agent_total_tokens_total"
# Events that gave token counts: the denominator of tokens per answer.
AGENT_USAGE_EVENTS = "ragpulse_agent_usage_events_total"
# Conversations judged by the session judges (docs/sessions.md).
SESSIONS_JUDGED = "ragpulse_sessions_judged_total"
SESSIONS_TRUNCATED = "ragpulse_sessions_truncated_total"
# serve: sessions re-opened by a late turn (judged again, their first verdicts taken back out
# of the windows), and turns too late for their session (pipeline.service.conversations).
SESSIONS_REJUDGED = "ragpulse_session_rejudged_total"
SESSION_TURNS_LATE = "ragpulse_session_turns_late_total"
# serve: sessions judged before their gap ended, the oldest open ones beyond --session-max-open.
SESSIONS_CLOSED_EARLY = "ragpulse_sessions_closed_early_total"
# Stratified sampling and the judge budget (pipeline.costs.sampling, pipeline.costs.budget).
WEIGHTED_VERDICTS = "ragpulse_judge_verdicts_weighted_total"
SEEN = "ragpulse_seen_events_total"
SAMPLED = "ragpulse_sampled_events_total"
WEIGHTS = "ragpulse_sample_weights_total"
SPEND = "ragpulse_judge_spend_total"
# The judge cascade (pipeline.costs.cascade).
CASCADE_AGREEMENT = "ragpulse_cascade_agreement_total"
CASCADE_UNSURE = "ragpulse_cascade_llm_unsure_total"
# The review queue (pipeline.stages.review, docs/review.md).
REVIEW_QUEUED = "ragpulse_review_queued_total"
REVIEW_HELD_BACK = "ragpulse_review_held_back_total"
REVIEW_REFUSED = "ragpulse_review_refused_total"
# serve: the reviewers' labels read back (pipeline.service.labels): the confusion counts of each
# judge, prompt version and slice, and every labels-topic record by what became of it.
REVIEW_LABELS = "ragpulse_review_labels_total"
REVIEW_LABELS_READ = "ragpulse_review_labels_read_total"
REVIEW_LABEL_GRADES = "ragpulse_review_label_grades_total"
LabelOutcome = Literal[
    "counted", "duplicate", "not_binary", "unknown_judge", "unknown_event", "other_version",
    "malformed",
]
LABEL_OUTCOMES: tuple[LabelOutcome, ...] = get_args(LabelOutcome)

# -- counter parts that the collector folds into a histogram or a summary -----------------------
LATENCY_BUCKET = "ragpulse_judge_latency_seconds_bucket"  # non-cumulative count per `le`
LATENCY_SUM_US = "ragpulse_judge_latency_seconds_sum_us"
LATENCY_COUNT = "ragpulse_judge_latency_seconds_count"
AGENT_LATENCY_BUCKET = "ragpulse_agent_latency_seconds_bucket"  # non-cumulative count per `le`
AGENT_LATENCY_SUM_US = "ragpulse_agent_latency_seconds_sum_us"
AGENT_LATENCY_COUNT = "ragpulse_agent_latency_seconds_count"
# Scores of judges on a graded scale, exported as the summary `SCORE` (_sum and _count); the
# sum is kept in thousandths so that it adds up as an integer.
SCORE_COUNT = "ragpulse_judge_score_count"
SCORE_SUM_MILLI = "ragpulse_judge_score_sum_milli"

# -- gauges set by serve, the exporter and the budget governor ----------------------------------
LAST_COMPLETE_WINDOW_END = "ragpulse_last_complete_window_end_timestamp_seconds"
WATERMARK = "ragpulse_watermark_timestamp_seconds"
HEARTBEAT = "ragpulse_heartbeat_timestamp_seconds"
TRACES_PENDING = "ragpulse_traces_pending"
SESSIONS_OPEN = "ragpulse_sessions_open"
BUDGET_PER_HOUR = "ragpulse_judge_budget_per_hour"
BUDGET_SPENT_THIS_HOUR = "ragpulse_judge_budget_spent_this_hour"
SAMPLE_FACTOR = "ragpulse_judge_sample_factor"
# `ragpulse review`'s /metrics: the review queue's depth (pipeline/review/queue.py).
REVIEW_QUEUE_DEPTH = "ragpulse_review_queue_depth"

# -- families the collector builds at scrape time ------------------------------------------------
JUDGE_LATENCY = "ragpulse_judge_latency_seconds"  # histogram
AGENT_LATENCY = "ragpulse_agent_latency_seconds"  # histogram
SCORE = "ragpulse_judge_score"  # summary
CYCLES = "ragpulse_cycles"  # counter (exposed as ragpulse_cycles_total)
CYCLE_DURATION = "ragpulse_cycle_duration_seconds"  # histogram
CONSUMER_LAG = "ragpulse_consumer_lag"
CALIBRATION_LABELLED = "ragpulse_judge_calibration_labelled"
CALIBRATION_SENSITIVITY = "ragpulse_judge_calibration_sensitivity"
CALIBRATION_SPECIFICITY = "ragpulse_judge_calibration_specificity"
# serve: each judge against the reviewers' labels, per running prompt version and slice.
HUMAN_KAPPA = "ragpulse_judge_human_agreement_kappa"
HUMAN_SENSITIVITY = "ragpulse_judge_human_sensitivity"
HUMAN_SPECIFICITY = "ragpulse_judge_human_specificity"
HUMAN_LABELS = "ragpulse_judge_human_labels"
# Window gauges: WINDOW_PREFIX + suffix for the latest complete window of each series,
# IN_PROGRESS_PREFIX + suffix for the window still open (serve).
WINDOW_PREFIX = "ragpulse_judge_"
IN_PROGRESS_PREFIX = "ragpulse_judge_in_progress_"
WINDOW_SUFFIXES = (
    "pass_ratio", "window_samples", "pass_ratio_ci_low", "pass_ratio_ci_high", "score_mean",
    "pass_ratio_corrected", "pass_ratio_corrected_ci_low", "pass_ratio_corrected_ci_high",
)

COUNTER_HELP: dict[str, str] = {
    EVENTS: "Inference-log records read, by parse outcome (accepted or invalid).",
    EVENTS_SAMPLED: "Accepted events kept by deterministic sampling.",
    EVENTS_JUDGED: "Sampled events that went through the judge panel.",
    LATE_EVENTS: "Events whose window was already closed; kept out of windows and sent to the "
    "dead-letter output.",
    DEAD_LETTERS: "Records written to the dead-letter output (invalid or late).",
    VERDICTS: "Judge verdicts by rating (yes, no, error).",
    JUDGE_CALLS: "Verdicts a judge was called for, by judge and backend (cache hits are not "
    "calls).",
    CACHE_HITS: "Verdicts given again from the verdict cache for an identical input (same "
    "judge, prompt version, event), without a call, by judge.",
    JUDGE_ERRORS: "Verdicts with rating 'error', by cause.",
    ENSEMBLE_VOTES: "Verdicts of ensemble judges (--ensemble) by how their members voted: "
    "unanimous, split (the majority decided) or incomplete (some member could not grade).",
    SKIPPED: "Judges skipped for an event that lacks their required field (missing: the "
    "inputs, e.g. expected for correctness); not verdicts, in no ratio or window.",
    TOKENS: "Tokens used by LLM judges, by kind (prompt, completion; cached_prompt: the part of "
    "prompt the provider read from its prompt cache).",
    RETRIEVED_CHUNKS: "Retrieved chunks summed over judged events.",
    WITHOUT_CONTEXT: "Judged events that had no retrieved context.",
    GROUNDED_BY_CONTEXT: "Groundedness verdicts of answers that context_sufficiency also "
    "judged, by whether their retrieved context was sufficient (both judges must run).",
    CYCLES + "_total": "Serve micro-batch cycles, by outcome.",
    CANARY_VERDICTS: "Verdicts on golden-set canaries, by agreement with the human label "
    "(agree, disagree, error); canaries count nowhere else.",
    OFFSET_RESETS: "Partitions whose saved offset was outside the partition, by kind: "
    "beyond_end (topic recreated, truncated or emptied), below_start (retention ahead of "
    "serve); handled by --on-offset-reset.",
    RECORDS_LOST: "Records skipped without being judged, by reason: retention (deleted before "
    "they were read), topic_reset (skipped by --on-offset-reset latest).",
    UNDELIVERABLE: "Dead letters and verdict rows dropped because the broker refused them for "
    "good or did not acknowledge them within --undeliverable-after, by the topic they were "
    "meant for.",
    LABEL_OVERFLOW: "Judged events counted under app or model 'other': their value was beyond "
    "--max-label-values or not in --allowed-apps/--allowed-models (for guideline: the verdicts "
    "counted under 'other').",
    AGENT_INPUT_TOKENS: "The chatbot's own input (prompt) tokens, from the events' usage, per "
    "app and model, over every accepted event (sampled or not).",
    AGENT_OUTPUT_TOKENS: "The chatbot's own output (completion) tokens, from the events' usage, "
    "per app and model.",
    AGENT_TOTAL_TOKENS: "The chatbot's own total tokens, from the events' usage (input + output "
    "when the event gives no total), per app and model.",
    AGENT_USAGE_EVENTS: "Accepted events that gave the chatbot's token usage, per app and "
    f"model: tokens per answer = rate({AGENT_TOTAL_TOKENS}) / rate(this).",
    SESSIONS_JUDGED: "Conversations (session windows of turns sharing a session_id) that went "
    "through the session judges, per app and model.",
    SESSIONS_TRUNCATED: "Judged conversations over --session-max-turns or --session-max-bytes, "
    "judged on their last turns only, per app and model.",
    SESSIONS_REJUDGED: "Judged conversations re-opened by a late turn, per app: each is "
    "judged again once the watermark passes its new end, and its first verdicts are taken back "
    "out of the window counts, so that a window counts a conversation once.",
    SESSION_TURNS_LATE: "serve: turns that arrived after their conversation was judged and one "
    "of its verdicts' windows was final, per app: left out of the conversation (the answer "
    "itself is judged and counted as usual).",
    SESSIONS_CLOSED_EARLY: "serve: conversations judged before --session-gap had passed since "
    "their last turn, because more than --session-max-open were open, per app: the ones with "
    "the oldest last turn, judged on the turns they had (a later turn re-opens one as a late "
    "turn does).",
    WEIGHTED_VERDICTS: "Judge verdicts weighted by 1 / the sample rate of the event's stratum: "
    "estimated verdicts in all traffic, by judge, rating, stratum, app and model. The weighted "
    "pass ratio, yes / (yes + no) of these, is an unbiased estimate of the population's.",
    SEEN: "Accepted, on-time events by sampling stratum (the first matching --sampling-rules "
    "rule, or default), judged or not.",
    SAMPLED: "Events kept for judging, by sampling stratum.",
    WEIGHTS: "Summed weights (1 / sample rate) of the events kept, by sampling stratum; "
    f"it estimates {SEEN} of the stratum.",
    SPEND: "Judge spend in the budget's unit (tokens, or the price table's currency), by unit.",
    CASCADE_AGREEMENT: "Events both the local and the LLM judge rated yes or no in the judge "
    "cascade, by judge, whether they agreed, and why the LLM ran (sample: the "
    "--cascade-llm-sample-rate share, an estimate for all traffic; uncertain: the local rating "
    "was near its threshold).",
    PROMPT_CHARS_CUT: "Characters of events' inputs left out of LLM judge prompts (each input "
    "is cut at 16,000 characters), by judge.",
    CASCADE_UNSURE: "LLM verdicts of the judge cascade whose P(yes) (--judge-logprobs) is "
    "within --cascade-uncertainty-band of 0.5: events neither tier is sure of, by judge and "
    "why the LLM ran.",
    REVIEW_QUEUED: "Judged events published to the review topic, by why they were queued "
    "(random: the uniform --review-rate slice; disagreement, unsure, failing: targeted).",
    REVIEW_HELD_BACK: "Events chosen for review that --review-max-per-hour held back, by why "
    "they were chosen.",
    REVIEW_REFUSED: "Review items refused, by reason (too_large: over the review page's limit; "
    "invalid: not a valid review item, e.g. an event id over 4096 characters).",
    REVIEW_LABELS: "serve and stream: reviewers' labels of yes/no verdicts counted once each, "
    "by judge, prompt version, slice (random: the uniform --review-rate slice, the error-rate "
    "estimate's; targeted: items queued on purpose), the reviewer's rating (human) and the "
    "judge's (rating).",
    REVIEW_LABEL_GRADES: "serve and stream: reviewers' correct scores on a graded scale, "
    "counted once each, by judge, prompt version, slice, the reviewer's score (grade) and the "
    "judge's rating; mapped to pass/fail by the judge's pass score, they are also in "
    "ragpulse_review_labels_total.",
    REVIEW_LABELS_READ: "serve and stream: labels-topic records read, by outcome: counted; "
    "duplicate (a label id counted already); not_binary (the judge could not grade, or a "
    "graded scale's correct score of a judge whose pass score is not known); and, sent to the "
    "dead-letter topic with the reason, unknown_judge, unknown_event (no review item with this "
    "event id and judge is on record), other_version (not the judged prompt version) and "
    "malformed.",
}

GAUGE_HELP: dict[str, str] = {
    LAST_COMPLETE_WINDOW_END: "End of the latest complete window.",
    WATERMARK: "Event-time watermark: min over partitions of the latest event time read, minus "
    "the out-of-orderness bound.",
    HEARTBEAT: "Unix time at which the last cycle completed.",
    BUDGET_PER_HOUR: "The judge budget per clock hour (--judge-budget-per-hour), in tokens, or "
    "in the currency of --judge-price-table.",
    BUDGET_SPENT_THIS_HOUR: "Judge spend in the current clock hour, in the budget's unit (saved "
    "in the state file: restarts within the hour go on from it).",
    SAMPLE_FACTOR: "The budget governor's factor on every sampling stratum's rate in the last "
    "cycle (1: not limited; rates never go below --judge-min-sample-rate).",
    SESSIONS_OPEN: "serve: conversations open (not judged yet) in the state file after the "
    "last cycle; at most --session-max-open, plus the sessions one cycle starts.",
    REVIEW_QUEUE_DEPTH: "ragpulse review: the review queue's depth, by state: unlabelled "
    "(items the page holds that no reviewer has labelled a judge of yet) and unread "
    "(review-topic records past the page's positions).",
    TRACES_PENDING: "Traces whose spans are held for assembly (--input-format otlp_*), waiting "
    "for --trace-assembly-wait to pass.",
}

# The families built at scrape time, with their help texts. A `{what}` in a window family's
# help is "latest complete" or "in-progress".
FAMILY_HELP: dict[str, str] = {
    JUDGE_LATENCY: "Time to grade one event, per judge.",
    AGENT_LATENCY: "The chatbot's own time to answer (the events' latency_seconds, or the "
    "trace's root span duration), per app and model, over every accepted event that gave one.",
    SCORE: "Scores of judges on a graded scale (0-3, 1-5, a composite): rate(_sum) / "
    f"rate(_count) is the mean; {VERDICTS}{{rating=yes}} counts those at or above the pass "
    "score.",
    CYCLE_DURATION: "Wall time of one serve cycle that read events.",
    CONSUMER_LAG: "Records in the topic not yet processed, per partition, on every partition "
    "of the topic: this instance's from its state file, the others' from the consumer group's "
    "committed offsets (from the log start when none has committed); max by partition across "
    "instances.",
    CALIBRATION_LABELLED: "Human-labelled events the judge graded that its pass ratio is "
    "corrected with, by label: the --judge-calibration set plus, in serve, the reviewers' "
    "labels of the random slice of the running prompt version (stream: the reviewers' labels "
    "alone).",
    CALIBRATION_SENSITIVITY: "Share of the labelled passes the judge passed (the "
    "--judge-calibration set and the random slice's review labels).",
    CALIBRATION_SPECIFICITY: "Share of the labelled fails the judge failed (the "
    "--judge-calibration set and the random slice's review labels).",
    HUMAN_KAPPA: "serve and stream: Cohen's kappa of the judge's yes/no ratings and the "
    "reviewers', per running prompt version and slice (random: the unbiased estimate; "
    "targeted: apart).",
    HUMAN_SENSITIVITY: "serve and stream: share of the items reviewers passed that the judge "
    "passed, per running prompt version and slice.",
    HUMAN_SPECIFICITY: "serve and stream: share of the items reviewers failed that the judge "
    "failed, per running prompt version and slice.",
    HUMAN_LABELS: "serve and stream: reviewers' yes/no labels behind the three figures "
    "above, per running prompt version, slice and the reviewer's rating (human).",
}

_HISTOGRAMS = (JUDGE_LATENCY, AGENT_LATENCY, CYCLE_DURATION)


def exposed_names() -> frozenset[str]:
    """Every sample name a scrape of ragpulse can show (histograms and the summary with their
    _bucket/_sum/_count, the window gauges under both prefixes): what rules and dashboards may
    query."""
    names = set(COUNTER_HELP) | set(GAUGE_HELP) | set(FAMILY_HELP)
    names |= {f"{h}{part}" for h in _HISTOGRAMS for part in ("_bucket", "_sum", "_count")}
    names |= {f"{SCORE}_sum", f"{SCORE}_count"}
    names |= {p + s for p in (WINDOW_PREFIX, IN_PROGRESS_PREFIX) for s in WINDOW_SUFFIXES}
    return frozenset(names)


ALL_NAMES = exposed_names()
