#include "sinks/nats/nats_outcomes.hpp"

#include "sinks/nats/cnats.hpp"

namespace outbox::sinks {
namespace {

// A JetStream error code from a PubAck. Exhaustive over nats.c's jsErrCode, with no default: a
// nats.c upgrade that adds codes fails the build (-Wswitch, -Werror) until someone decides what
// they mean. The server may send codes this nats.c does not know: they retry (after the switch).
// Its length is the number of codes nats.c has (the switch is read as a table).
// NOLINTNEXTLINE(readability-function-size)
NatsErrorClass classify_js_code(int code) {
  // Only values in the enum's range may be converted to it (a newer server's codes are larger):
  // keep these bounds at the first and last enumerator when the switch learns new ones.
  if (code < JSAccountResourcesExceededErr || code > JSConsumerReplicasExceedsStreamErr) return NatsErrorClass::kRetry;
  switch (static_cast<jsErrCode>(code)) {
    // The event itself is unacceptable to the stream: re-sending it unchanged cannot succeed.
    case JSStreamMessageExceedsMaximumErr:  // over the stream's max_msg_size
    case JSStreamSealedErr:                 // a sealed stream never takes a message again
      return NatsErrorClass::kPermanent;

    // Everything else: transient (storage, cluster, leader election, limits with discard new),
    // or a condition an operator fixes without touching the row (the sink sends no Nats-Expected-*
    // header, so the "wrong last ..." codes cannot be the event's fault). Retry with backoff;
    // max_attempts still dead-letters an event that never gets through.
    case JSAccountResourcesExceededErr:
    case JSBadRequestErr:
    case JSClusterIncompleteErr:
    case JSClusterNoPeersErr:
    case JSClusterNotActiveErr:
    case JSClusterNotAssignedErr:
    case JSClusterNotAvailErr:
    case JSClusterNotLeaderErr:
    case JSClusterRequiredErr:
    case JSClusterTagsErr:
    case JSConsumerCreateErr:
    case JSConsumerNameExistErr:
    case JSConsumerNotFoundErr:
    case JSSnapshotDeliverSubjectInvalidErr:
    case JSConsumerDurableNameNotInSubjectErr:
    case JSConsumerDurableNameNotMatchSubjectErr:
    case JSConsumerDurableNameNotSetErr:
    case JSConsumerEphemeralWithDurableInSubjectErr:
    case JSConsumerEphemeralWithDurableNameErr:
    case JSStreamExternalApiOverlapErr:
    case JSStreamExternalDelPrefixOverlapsErr:
    case JSInsufficientResourcesErr:
    case JSStreamInvalidExternalDeliverySubjErr:
    case JSInvalidJSONErr:
    case JSMaximumConsumersLimitErr:
    case JSMaximumStreamsLimitErr:
    case JSMemoryResourcesExceededErr:
    case JSMirrorConsumerSetupFailedErr:
    case JSMirrorMaxMessageSizeTooBigErr:
    case JSMirrorWithSourcesErr:
    case JSMirrorWithStartSeqAndTimeErr:
    case JSMirrorWithSubjectFiltersErr:
    case JSMirrorWithSubjectsErr:
    case JSNoAccountErr:
    case JSClusterUnSupportFeatureErr:
    case JSNoMessageFoundErr:
    case JSNotEmptyRequestErr:
    case JSNotEnabledForAccountErr:
    case JSClusterPeerNotMemberErr:
    case JSRaftGeneralErr:
    case JSRestoreSubscribeFailedErr:
    case JSSequenceNotFoundErr:
    case JSClusterServerNotMemberErr:
    case JSSourceConsumerSetupFailedErr:
    case JSSourceMaxMessageSizeTooBigErr:
    case JSStorageResourcesExceededErr:
    case JSStreamAssignmentErr:
    case JSStreamCreateErr:
    case JSStreamDeleteErr:
    case JSStreamGeneralError:
    case JSStreamInvalidConfig:
    case JSStreamLimitsErr:
    case JSStreamMirrorNotUpdatableErr:
    case JSStreamMismatchErr:
    case JSStreamMsgDeleteFailed:
    case JSStreamNameExistErr:
    case JSStreamNotFoundErr:
    case JSStreamNotMatchErr:
    case JSStreamReplicasNotUpdatableErr:
    case JSStreamRestoreErr:
    case JSStreamSequenceNotMatchErr:
    case JSStreamSnapshotErr:
    case JSStreamSubjectOverlapErr:
    case JSStreamTemplateCreateErr:
    case JSStreamTemplateDeleteErr:
    case JSStreamTemplateNotFoundErr:
    case JSStreamUpdateErr:
    case JSStreamWrongLastMsgIDErr:
    case JSStreamWrongLastSequenceErr:
    case JSTempStorageFailedErr:
    case JSTemplateNameNotMatchSubjectErr:
    case JSStreamReplicasNotSupportedErr:
    case JSPeerRemapErr:
    case JSNotEnabledErr:
    case JSStreamStoreFailedErr:
    case JSConsumerConfigRequiredErr:
    case JSConsumerDeliverToWildcardsErr:
    case JSConsumerPushMaxWaitingErr:
    case JSConsumerDeliverCycleErr:
    case JSConsumerMaxPendingAckPolicyRequiredErr:
    case JSConsumerSmallHeartbeatErr:
    case JSConsumerPullRequiresAckErr:
    case JSConsumerPullNotDurableErr:
    case JSConsumerPullWithRateLimitErr:
    case JSConsumerMaxWaitingNegativeErr:
    case JSConsumerHBRequiresPushErr:
    case JSConsumerFCRequiresPushErr:
    case JSConsumerDirectRequiresPushErr:
    case JSConsumerDirectRequiresEphemeralErr:
    case JSConsumerOnMappedErr:
    case JSConsumerFilterNotSubsetErr:
    case JSConsumerInvalidPolicyErr:
    case JSConsumerInvalidSamplingErr:
    case JSStreamInvalidErr:
    case JSConsumerWQRequiresExplicitAckErr:
    case JSConsumerWQMultipleUnfilteredErr:
    case JSConsumerWQConsumerNotUniqueErr:
    case JSConsumerWQConsumerNotDeliverAllErr:
    case JSConsumerNameTooLongErr:
    case JSConsumerBadDurableNameErr:
    case JSConsumerStoreFailedErr:
    case JSConsumerExistingActiveErr:
    case JSConsumerReplacementWithDifferentNameErr:
    case JSConsumerDescriptionTooLongErr:
    case JSConsumerWithFlowControlNeedsHeartbeatsErr:
    case JSStreamPurgeFailedErr:
    case JSStreamRollupFailedErr:
    case JSConsumerInvalidDeliverSubjectErr:
    case JSStreamMaxBytesRequiredErr:
    case JSConsumerMaxRequestBatchNegativeErr:
    case JSConsumerMaxRequestExpiresToSmallErr:
    case JSConsumerMaxDeliverBackoffErr:
    case JSStreamInfoMaxSubjectsErr:
    case JSStreamOfflineErr:
    case JSConsumerOfflineErr:
    case JSNoLimitsErr:
    case JSConsumerMaxPendingAckExcessErr:
    case JSStreamMaxStreamBytesExceededErr:
    case JSStreamMoveAndScaleErr:
    case JSStreamMoveInProgressErr:
    case JSConsumerMaxRequestBatchExceededErr:
    case JSConsumerReplicasExceedsStreamErr: return NatsErrorClass::kRetry;
  }
  return NatsErrorClass::kRetry;  // a code this nats.c does not know
}

}  // namespace

NatsErrorClass classify_nats_error(int status, int js_code, bool no_stream_permanent) {
  // Exhaustive over natsStatus, with no default (see classify_js_code, also for the bounds).
  if (status < NATS_OK || status > NATS_MISSED_HEARTBEAT) return NatsErrorClass::kRetry;
  switch (static_cast<natsStatus>(status)) {
    // A JetStream error reply: its code decides.
    case NATS_ERR: return js_code != 0 ? classify_js_code(js_code) : NatsErrorClass::kRetry;

    // No stream captures the subject (the server answered a request nobody listens to): the
    // sink's no_stream setting.
    case NATS_NO_RESPONDERS: return no_stream_permanent ? NatsErrorClass::kPermanent : NatsErrorClass::kRetry;

    // The event itself cannot be published as it is.
    case NATS_MAX_PAYLOAD:      // over the server's max_payload (checked by the client)
    case NATS_INVALID_SUBJECT:  // the subject is not one a message can be published to
    case NATS_NOT_PERMITTED:    // the account may not publish to this subject
      return NatsErrorClass::kPermanent;

    // Connection, timeout and client-state failures: not the event's fault.
    case NATS_PROTOCOL_ERROR:
    case NATS_IO_ERROR:
    case NATS_LINE_TOO_LONG:
    case NATS_CONNECTION_CLOSED:
    case NATS_NO_SERVER:
    case NATS_STALE_CONNECTION:
    case NATS_SECURE_CONNECTION_WANTED:
    case NATS_SECURE_CONNECTION_REQUIRED:
    case NATS_CONNECTION_DISCONNECTED:
    case NATS_CONNECTION_AUTH_FAILED:
    case NATS_NOT_FOUND:
    case NATS_ADDRESS_MISSING:
    case NATS_INVALID_ARG:
    case NATS_INVALID_SUBSCRIPTION:
    case NATS_INVALID_TIMEOUT:
    case NATS_ILLEGAL_STATE:
    case NATS_SLOW_CONSUMER:
    case NATS_MAX_DELIVERED_MSGS:
    case NATS_INSUFFICIENT_BUFFER:
    case NATS_NO_MEMORY:
    case NATS_SYS_ERROR:
    case NATS_TIMEOUT:
    case NATS_FAILED_TO_INITIALIZE:
    case NATS_NOT_INITIALIZED:
    case NATS_SSL_ERROR:
    case NATS_NO_SERVER_SUPPORT:
    case NATS_NOT_YET_CONNECTED:
    case NATS_DRAINING:
    case NATS_INVALID_QUEUE_NAME:
    case NATS_MISMATCH:
    case NATS_MISSED_HEARTBEAT:
    case NATS_OK:  // not a failure; callers never pass it
      return NatsErrorClass::kRetry;
  }
  return NatsErrorClass::kRetry;  // a status this nats.c does not know
}

}  // namespace outbox::sinks
