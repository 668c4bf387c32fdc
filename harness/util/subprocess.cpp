#include "harness/util/subprocess.hpp"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "harness/util/error.hpp"

extern char** environ;

namespace kvb {

std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string dir = end > start ? dirs.substr(start, end - start) : ".";
    const std::string p = (std::filesystem::path(dir) / name).string();
    if (access(p.c_str(), X_OK) == 0 && !std::filesystem::is_directory(p)) return p;
    start = end + 1;
  }
  return "";
}

namespace {

struct Pipe {
  int fd[2] = {-1, -1};
  Pipe() {
    if (pipe2(fd, O_CLOEXEC) != 0) fail("cannot create a pipe: {}", std::strerror(errno));
  }
  ~Pipe() { close_both(); }
  void close_end(int i) {
    if (fd[i] >= 0) close(fd[i]);
    fd[i] = -1;
  }
  void close_both() {
    close_end(0);
    close_end(1);
  }
};

}  // namespace

ProcessResult run_process(const std::vector<std::string>& argv, const std::string& input) {
  if (argv.empty()) fail("run_process: no program given");
  const std::string program = find_program(argv[0]);
  if (program.empty()) fail("{}: program not found on PATH", argv[0]);
  Pipe in, out, err;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in.fd[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out.fd[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err.fd[1], 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, program.c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) fail("{}: cannot start: {}", program, std::strerror(rc));
  in.close_end(0);
  out.close_end(1);
  err.close_end(1);
  // Feed stdin and drain both outputs together, so that a chatty program never blocks on a full pipe.
  ProcessResult r;
  size_t written = 0;
  if (input.empty())
    in.close_end(1);
  else
    fcntl(in.fd[1], F_SETFL, O_NONBLOCK);
  char buf[4096];
  while (out.fd[0] >= 0 || err.fd[0] >= 0) {
    pollfd fds[3];
    int n = 0;
    for (int f : {out.fd[0], err.fd[0]})
      if (f >= 0) fds[n++] = {f, POLLIN, 0};
    if (in.fd[1] >= 0) fds[n++] = {in.fd[1], POLLOUT, 0};
    if (poll(fds, nfds_t(n), -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < n; ++i) {
      if (!fds[i].revents) continue;
      if (fds[i].fd == in.fd[1]) {
        const ssize_t w = write(in.fd[1], input.data() + written, input.size() - written);
        if (w > 0) written += size_t(w);
        if (w < 0 || written == input.size()) in.close_end(1);
        continue;
      }
      const ssize_t got = read(fds[i].fd, buf, sizeof buf);
      if (got > 0) {
        (fds[i].fd == out.fd[0] ? r.out : r.err).append(buf, size_t(got));
      } else if (got == 0 || errno != EINTR) {
        (fds[i].fd == out.fd[0] ? out : err).close_end(0);
      }
    }
  }
  in.close_end(1);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

}  // namespace kvb
