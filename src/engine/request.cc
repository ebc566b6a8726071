#include "engine/request.h"

namespace specula {

bool is_finished(RequestStatus s) {
  return s == RequestStatus::kFinishedStopped || s == RequestStatus::kFinishedLength ||
         s == RequestStatus::kFinishedAborted || s == RequestStatus::kFinishedError;
}

FinishReason finish_reason_of(RequestStatus s) {
  switch (s) {
    case RequestStatus::kFinishedStopped: return FinishReason::kStop;
    case RequestStatus::kFinishedLength: return FinishReason::kLength;
    case RequestStatus::kFinishedAborted:
    case RequestStatus::kFinishedError: return FinishReason::kAbort;
    default: return FinishReason::kNone;
  }
}

std::string_view status_name(RequestStatus s) {
  switch (s) {
    case RequestStatus::kWaiting: return "waiting";
    case RequestStatus::kRunning: return "running";
    case RequestStatus::kPreempted: return "preempted";
    case RequestStatus::kFinishedStopped: return "finished_stopped";
    case RequestStatus::kFinishedLength: return "finished_length";
    case RequestStatus::kFinishedAborted: return "finished_aborted";
    case RequestStatus::kFinishedError: return "finished_error";
  }
  return "?";
}

}  // namespace specula
