// Where each engine thread is, for the report on a stuck step: a tensor-parallel hang shows as
// GPUs that spin in a collective while some rank's host thread is blocked in a call (a driver
// lock, an allocation, a copy) that only its stack names. Debuggers need ptrace rights a
// container often lacks, so the process walks its own stacks: each chosen thread is signalled in
// turn and writes its frames (glibc's backtrace) to a file descriptor. Frames in a stripped
// binary print as `path(+0xOFFSET)`: `addr2line -f -C -e <the unstripped build> 0xOFFSET` names them.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace specula {

// Names the calling thread (at most 15 characters are kept, the kernel's limit) and enrols it in
// the threads write_thread_stacks reports. Threads it starts later inherit the name (an OpenMP
// pool: 64 of them per rank on the GPU machine) but are not enrolled.
void name_current_thread(const std::string& name);

// The calling thread's id (gettid), for naming a thread whose stack is wanted.
pid_t current_thread_id();

// Writes, to `fd`, the stack of every enrolled thread still running and of each thread in `also`
// (never the caller's own), each after a "thread TID NAME:" line. A thread that does not answer
// within a second (blocked with the signal masked) is reported as such. Returns how many stacks
// were written. Reports from several threads run one after the other.
int write_thread_stacks(int fd, const std::vector<pid_t>& also = {});

}  // namespace specula
