# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# include()d by the run_*.cmake scripts of this folder, which get MPIEXEC and PROGRAM from the
# command line and build `flags` themselves.
#
# gradcomp_mpi_job(RANKS ARG...): runs `MPIEXEC flags -n RANKS PROGRAM ARG...` (killed after
# 90 s) and sets, in the caller's scope, rc (exit status, or a message with "timeout"), out and
# err (the job's standard output and error) and elapsed (whole seconds).
function(gradcomp_mpi_job ranks)
  string(TIMESTAMP start "%s")
  execute_process(
    COMMAND "${MPIEXEC}" ${flags} -n ${ranks} "${PROGRAM}" ${ARGN}
    RESULT_VARIABLE job_rc
    OUTPUT_VARIABLE job_out
    ERROR_VARIABLE job_err
    TIMEOUT 90)
  string(TIMESTAMP stop "%s")
  math(EXPR job_elapsed "${stop} - ${start}")
  set(rc "${job_rc}" PARENT_SCOPE)
  set(out "${job_out}" PARENT_SCOPE)
  set(err "${job_err}" PARENT_SCOPE)
  set(elapsed "${job_elapsed}" PARENT_SCOPE)
endfunction()
