#include "sinks/kafka/kafka_outcomes.hpp"

#include <string_view>
#include <unordered_set>

#include "sinks/kafka/rdkafka.hpp"

namespace outbox::sinks {

KafkaErrorClass classify_kafka_error(int code, bool topic_auto_create) {
  // Exhaustive over librdkafka's rd_kafka_resp_err_t, with no default: a librdkafka upgrade that
  // adds codes fails the build (-Wswitch, -Werror) until someone decides what they mean.
  switch (static_cast<rd_kafka_resp_err_t>(code)) {
    // The event itself is unacceptable to Kafka: re-sending it unchanged cannot succeed.
    // (The broker checks max.message.bytes per record batch: librdkafka's batch.size, 1,000,000
    // by default, must stay at or below the topic's limit, 1,048,588 by default, or a batch of
    // small events could be refused whole. A batch over batch.size holds a single message.)
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:       // broker limit, or local message.max.bytes
    case RD_KAFKA_RESP_ERR_INVALID_MSG:              // broker: invalid (corrupt) message
    case RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE:         // broker: invalid message size
    case RD_KAFKA_RESP_ERR_INVALID_RECORD:           // broker rejected the record (e.g. compaction, no key)
    case RD_KAFKA_RESP_ERR__BAD_MSG:                 // local: bad message format
    case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:          // broker: invalid topic name
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
      return KafkaErrorClass::kPermanent;

    // A missing topic is permanent only when nobody will create it on demand.
    case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
    case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
      return topic_auto_create ? KafkaErrorClass::kRetry : KafkaErrorClass::kPermanent;

    // The idempotent producer cannot keep its guarantees any more (sequence desync, fencing).
    case RD_KAFKA_RESP_ERR__FATAL:
      return KafkaErrorClass::kFatal;

    // Everything else: transient, or a cluster/config condition that is not this event's fault
    // (and that an operator fixes without touching the row). Retry with backoff; max_attempts
    // still dead-letters an event that never gets through.
    case RD_KAFKA_RESP_ERR__BEGIN:
    case RD_KAFKA_RESP_ERR__BAD_COMPRESSION:
    case RD_KAFKA_RESP_ERR__DESTROY:
    case RD_KAFKA_RESP_ERR__FAIL:
    case RD_KAFKA_RESP_ERR__TRANSPORT:
    case RD_KAFKA_RESP_ERR__CRIT_SYS_RESOURCE:
    case RD_KAFKA_RESP_ERR__RESOLVE:
    case RD_KAFKA_RESP_ERR__MSG_TIMED_OUT:
    case RD_KAFKA_RESP_ERR__PARTITION_EOF:
    case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
    case RD_KAFKA_RESP_ERR__FS:
    case RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN:
    case RD_KAFKA_RESP_ERR__INVALID_ARG:
    case RD_KAFKA_RESP_ERR__TIMED_OUT:
    case RD_KAFKA_RESP_ERR__QUEUE_FULL:
    case RD_KAFKA_RESP_ERR__ISR_INSUFF:
    case RD_KAFKA_RESP_ERR__NODE_UPDATE:
    case RD_KAFKA_RESP_ERR__SSL:
    case RD_KAFKA_RESP_ERR__WAIT_COORD:
    case RD_KAFKA_RESP_ERR__UNKNOWN_GROUP:
    case RD_KAFKA_RESP_ERR__IN_PROGRESS:
    case RD_KAFKA_RESP_ERR__PREV_IN_PROGRESS:
    case RD_KAFKA_RESP_ERR__EXISTING_SUBSCRIPTION:
    case RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS:
    case RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS:
    case RD_KAFKA_RESP_ERR__CONFLICT:
    case RD_KAFKA_RESP_ERR__STATE:
    case RD_KAFKA_RESP_ERR__UNKNOWN_PROTOCOL:
    case RD_KAFKA_RESP_ERR__NOT_IMPLEMENTED:
    case RD_KAFKA_RESP_ERR__AUTHENTICATION:
    case RD_KAFKA_RESP_ERR__NO_OFFSET:
    case RD_KAFKA_RESP_ERR__OUTDATED:
    case RD_KAFKA_RESP_ERR__TIMED_OUT_QUEUE:
    case RD_KAFKA_RESP_ERR__UNSUPPORTED_FEATURE:
    case RD_KAFKA_RESP_ERR__WAIT_CACHE:
    case RD_KAFKA_RESP_ERR__INTR:
    case RD_KAFKA_RESP_ERR__KEY_SERIALIZATION:
    case RD_KAFKA_RESP_ERR__VALUE_SERIALIZATION:
    case RD_KAFKA_RESP_ERR__KEY_DESERIALIZATION:
    case RD_KAFKA_RESP_ERR__VALUE_DESERIALIZATION:
    case RD_KAFKA_RESP_ERR__PARTIAL:
    case RD_KAFKA_RESP_ERR__READ_ONLY:
    case RD_KAFKA_RESP_ERR__NOENT:
    case RD_KAFKA_RESP_ERR__UNDERFLOW:
    case RD_KAFKA_RESP_ERR__INVALID_TYPE:
    case RD_KAFKA_RESP_ERR__RETRY:
    case RD_KAFKA_RESP_ERR__PURGE_QUEUE:
    case RD_KAFKA_RESP_ERR__PURGE_INFLIGHT:
    case RD_KAFKA_RESP_ERR__INCONSISTENT:
    case RD_KAFKA_RESP_ERR__GAPLESS_GUARANTEE:
    case RD_KAFKA_RESP_ERR__MAX_POLL_EXCEEDED:
    case RD_KAFKA_RESP_ERR__UNKNOWN_BROKER:
    case RD_KAFKA_RESP_ERR__NOT_CONFIGURED:
    case RD_KAFKA_RESP_ERR__FENCED:
    case RD_KAFKA_RESP_ERR__APPLICATION:
    case RD_KAFKA_RESP_ERR__ASSIGNMENT_LOST:
    case RD_KAFKA_RESP_ERR__NOOP:
    case RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET:
    case RD_KAFKA_RESP_ERR__END:
    case RD_KAFKA_RESP_ERR_UNKNOWN:
    case RD_KAFKA_RESP_ERR_NO_ERROR:
    case RD_KAFKA_RESP_ERR_OFFSET_OUT_OF_RANGE:
    case RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION:
    case RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT:
    case RD_KAFKA_RESP_ERR_BROKER_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_REPLICA_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_STALE_CTRL_EPOCH:
    case RD_KAFKA_RESP_ERR_OFFSET_METADATA_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION:
    case RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS:
    case RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_NOT_COORDINATOR:
    case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS:
    case RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND:
    case RD_KAFKA_RESP_ERR_INVALID_REQUIRED_ACKS:
    case RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION:
    case RD_KAFKA_RESP_ERR_INCONSISTENT_GROUP_PROTOCOL:
    case RD_KAFKA_RESP_ERR_INVALID_GROUP_ID:
    case RD_KAFKA_RESP_ERR_UNKNOWN_MEMBER_ID:
    case RD_KAFKA_RESP_ERR_INVALID_SESSION_TIMEOUT:
    case RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS:
    case RD_KAFKA_RESP_ERR_INVALID_COMMIT_OFFSET_SIZE:
    case RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP:
    case RD_KAFKA_RESP_ERR_UNSUPPORTED_SASL_MECHANISM:
    case RD_KAFKA_RESP_ERR_ILLEGAL_SASL_STATE:
    case RD_KAFKA_RESP_ERR_UNSUPPORTED_VERSION:
    case RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS:
    case RD_KAFKA_RESP_ERR_INVALID_PARTITIONS:
    case RD_KAFKA_RESP_ERR_INVALID_REPLICATION_FACTOR:
    case RD_KAFKA_RESP_ERR_INVALID_REPLICA_ASSIGNMENT:
    case RD_KAFKA_RESP_ERR_INVALID_CONFIG:
    case RD_KAFKA_RESP_ERR_NOT_CONTROLLER:
    case RD_KAFKA_RESP_ERR_INVALID_REQUEST:
    case RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT:
    case RD_KAFKA_RESP_ERR_POLICY_VIOLATION:
    case RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER:
    case RD_KAFKA_RESP_ERR_DUPLICATE_SEQUENCE_NUMBER:
    case RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH:
    case RD_KAFKA_RESP_ERR_INVALID_TXN_STATE:
    case RD_KAFKA_RESP_ERR_INVALID_PRODUCER_ID_MAPPING:
    case RD_KAFKA_RESP_ERR_INVALID_TRANSACTION_TIMEOUT:
    case RD_KAFKA_RESP_ERR_CONCURRENT_TRANSACTIONS:
    case RD_KAFKA_RESP_ERR_TRANSACTION_COORDINATOR_FENCED:
    case RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_SECURITY_DISABLED:
    case RD_KAFKA_RESP_ERR_OPERATION_NOT_ATTEMPTED:
    case RD_KAFKA_RESP_ERR_KAFKA_STORAGE_ERROR:
    case RD_KAFKA_RESP_ERR_LOG_DIR_NOT_FOUND:
    case RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED:
    case RD_KAFKA_RESP_ERR_UNKNOWN_PRODUCER_ID:
    case RD_KAFKA_RESP_ERR_REASSIGNMENT_IN_PROGRESS:
    case RD_KAFKA_RESP_ERR_DELEGATION_TOKEN_AUTH_DISABLED:
    case RD_KAFKA_RESP_ERR_DELEGATION_TOKEN_NOT_FOUND:
    case RD_KAFKA_RESP_ERR_DELEGATION_TOKEN_OWNER_MISMATCH:
    case RD_KAFKA_RESP_ERR_DELEGATION_TOKEN_REQUEST_NOT_ALLOWED:
    case RD_KAFKA_RESP_ERR_DELEGATION_TOKEN_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_DELEGATION_TOKEN_EXPIRED:
    case RD_KAFKA_RESP_ERR_INVALID_PRINCIPAL_TYPE:
    case RD_KAFKA_RESP_ERR_NON_EMPTY_GROUP:
    case RD_KAFKA_RESP_ERR_GROUP_ID_NOT_FOUND:
    case RD_KAFKA_RESP_ERR_FETCH_SESSION_ID_NOT_FOUND:
    case RD_KAFKA_RESP_ERR_INVALID_FETCH_SESSION_EPOCH:
    case RD_KAFKA_RESP_ERR_LISTENER_NOT_FOUND:
    case RD_KAFKA_RESP_ERR_TOPIC_DELETION_DISABLED:
    case RD_KAFKA_RESP_ERR_FENCED_LEADER_EPOCH:
    case RD_KAFKA_RESP_ERR_UNKNOWN_LEADER_EPOCH:
    case RD_KAFKA_RESP_ERR_UNSUPPORTED_COMPRESSION_TYPE:
    case RD_KAFKA_RESP_ERR_STALE_BROKER_EPOCH:
    case RD_KAFKA_RESP_ERR_OFFSET_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_MEMBER_ID_REQUIRED:
    case RD_KAFKA_RESP_ERR_PREFERRED_LEADER_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_GROUP_MAX_SIZE_REACHED:
    case RD_KAFKA_RESP_ERR_FENCED_INSTANCE_ID:
    case RD_KAFKA_RESP_ERR_ELIGIBLE_LEADERS_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_ELECTION_NOT_NEEDED:
    case RD_KAFKA_RESP_ERR_NO_REASSIGNMENT_IN_PROGRESS:
    case RD_KAFKA_RESP_ERR_GROUP_SUBSCRIBED_TO_TOPIC:
    case RD_KAFKA_RESP_ERR_UNSTABLE_OFFSET_COMMIT:
    case RD_KAFKA_RESP_ERR_THROTTLING_QUOTA_EXCEEDED:
    case RD_KAFKA_RESP_ERR_PRODUCER_FENCED:
    case RD_KAFKA_RESP_ERR_RESOURCE_NOT_FOUND:
    case RD_KAFKA_RESP_ERR_DUPLICATE_RESOURCE:
    case RD_KAFKA_RESP_ERR_UNACCEPTABLE_CREDENTIAL:
    case RD_KAFKA_RESP_ERR_INCONSISTENT_VOTER_SET:
    case RD_KAFKA_RESP_ERR_INVALID_UPDATE_VERSION:
    case RD_KAFKA_RESP_ERR_FEATURE_UPDATE_FAILED:
    case RD_KAFKA_RESP_ERR_PRINCIPAL_DESERIALIZATION_FAILURE:
    case RD_KAFKA_RESP_ERR_END_ALL:
      return KafkaErrorClass::kRetry;
  }
  return KafkaErrorClass::kRetry;  // a code this librdkafka does not know
}

void hold_back_after_failures(std::span<const Event* const> events, std::vector<Outcome>& outcomes) {
  std::unordered_set<std::string_view> held;
  for (std::size_t i = 0; i < events.size() && i < outcomes.size(); ++i) {
    const std::string_view key = events[i]->key;
    Outcome& outcome = outcomes[i];
    switch (outcome.kind) {
      case OutcomeKind::kRetry:
      case OutcomeKind::kDeferred:
        held.insert(key);
        break;
      case OutcomeKind::kDelivered:
        if (held.count(key)) {
          outcome = Outcome::retry("acknowledged by Kafka, but an earlier event of the same key in this batch "
                                   "must be retried first; re-sent after it");
        }
        break;
      case OutcomeKind::kPermanent:
        break;
    }
  }
}

}  // namespace outbox::sinks
