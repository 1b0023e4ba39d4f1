// SIGINT/SIGTERM as a clean stop, whichever thread the kernel hands them to.
//
// A daemon that takes its stop signals with sigwait must have them blocked in every thread, but
// threads that a library starts before main (OpenBLAS's pool, from a load-time constructor) never
// saw that mask: a stop signal the kernel delivers to one of them kills the process on the spot
// ("killed by signal 15" in the middle of a drain). So the signals get a real handler instead,
// which only writes the signal's number to a pipe that WaitForStopSignal reads; the mask is still
// set first, so threads started later are not interrupted (EINTR) by them.
//
// A second SIGINT (Ctrl-C twice at a terminal) exits at once with status 130, as llama.cpp's
// server does; further SIGTERMs are ignored (a supervisor escalates with SIGKILL).
#pragma once

namespace specinfer {

// Installs the handlers and blocks SIGINT/SIGTERM in the calling thread, so threads it starts
// afterwards inherit the mask. Call before starting threads. Idempotent.
void InstallStopSignalHandlers();

// Unblocks SIGINT/SIGTERM in the calling thread and waits until one has arrived (in any thread);
// returns its number. Needs InstallStopSignalHandlers.
int WaitForStopSignal();

// In a child after fork(), before exec: the default actions again and nothing blocked, so the
// child's handler cannot write to its parent's pipe. (exec would reset the handlers too; this
// closes the window before it.)
void ResetStopSignalsInChild();

}  // namespace specinfer
