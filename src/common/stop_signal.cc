#include "common/stop_signal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <mutex>

namespace specinfer {
namespace {

int g_pipe[2] = {-1, -1};
std::atomic<int> g_received{0};

sigset_t StopSet() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGINT);
  sigaddset(&s, SIGTERM);
  return s;
}

// Async-signal-safe: an atomic, write and _exit only.
void OnStopSignal(int sig) {
  const int saved_errno = errno;
  if (g_received.fetch_add(1) > 0) {
    if (sig == SIGINT) {
      static const char kMsg[] = "\ninterrupted again: exiting now\n";
      (void)!write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
      _exit(130);
    }
    errno = saved_errno;
    return;
  }
  const unsigned char byte = static_cast<unsigned char>(sig);
  (void)!write(g_pipe[1], &byte, 1);
  errno = saved_errno;
}

}  // namespace

void InstallStopSignalHandlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (pipe2(g_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
      g_pipe[0] = g_pipe[1] = -1;
      return;  // no pipe (fds exhausted at start): sigwait in WaitForStopSignal, as before
    }
    struct sigaction sa {};
    sa.sa_handler = OnStopSignal;
    sigfillset(&sa.sa_mask);  // one handler at a time
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
  });
  const sigset_t s = StopSet();
  pthread_sigmask(SIG_BLOCK, &s, nullptr);
}

int WaitForStopSignal() {
  const sigset_t s = StopSet();
  if (g_pipe[0] < 0) {
    int sig = 0;
    sigwait(&s, &sig);
    return sig;
  }
  pthread_sigmask(SIG_UNBLOCK, &s, nullptr);
  for (;;) {
    pollfd p{g_pipe[0], POLLIN, 0};
    poll(&p, 1, -1);  // EINTR: the handler ran in this thread; the read below finds its byte
    unsigned char byte = 0;
    if (read(g_pipe[0], &byte, 1) == 1) {
      pthread_sigmask(SIG_BLOCK, &s, nullptr);
      return byte;
    }
  }
}

void ResetStopSignalsInChild() {
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  const sigset_t s = StopSet();
  pthread_sigmask(SIG_UNBLOCK, &s, nullptr);
}

}  // namespace specinfer
