module outbox-relay/bench/webhook/receiver

go 1.19
