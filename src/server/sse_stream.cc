#include <memory>

#include "server/api_error.h"
#include "server/routes.h"

namespace specula::server {

void install_sse_stream(httplib::Response& res, std::shared_ptr<GenerationRun> run,
                        std::function<bool(std::string*)> pump) {
  struct Session {
    std::shared_ptr<GenerationRun> run;
    std::function<bool(std::string*)> pump;
    bool done = false;
  };
  auto session = std::make_shared<Session>(Session{std::move(run), std::move(pump)});
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      // Exactly this type: cpp-httplib 0.11 gzips any other text/* (a client sending Accept-Encoding
      // would then get nothing until the stream ends).
      "text/event-stream",
      [session](size_t /*offset*/, httplib::DataSink& sink) -> bool {
        if (session->done) return false;
        std::string out;
        bool more = session->pump(&out);
        if (!more && out.empty()) {
          session->done = true;
          if (!session->run->stopped_by_shutdown()) return false;  // the client left: nothing to say
          // The server is shutting down: the client is told why its stream ends.
          const std::string bye = sse_event(service_unavailable("The server is shutting down; the request was not completed.").body()) + "data: [DONE]\n\n";
          if (sink.write(bye.data(), bye.size())) sink.done();
          return true;
        }
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          session->run->cancel();  // the client is gone: free its KV blocks now
          return false;
        }
        if (!more) {
          session->done = true;
          sink.done();
        }
        return true;
      },
      [session](bool /*success*/) {
        // Whatever ended the response (write failure, server stop), nothing more will be read.
        session->run->cancel();
      });
}

}  // namespace specula::server
