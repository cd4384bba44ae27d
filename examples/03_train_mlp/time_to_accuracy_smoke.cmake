# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# The bounded run of bench/run_time_to_accuracy.sh in the test suite (test
# example.time_to_accuracy_smoke): two short in-process runs of gradcomp_train (dense and static
# top-k x100, 2 workers, 40 steps, curve points on the whole test set) and
# bench/time_to_accuracy.py over them. It checks that the pieces fit (the train_s column, the
# table's rows), not the figures. Variables: TRAIN (the program), TTA (the script), PYTHON, DIR.

foreach(v TRAIN TTA PYTHON DIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "time_to_accuracy_smoke.cmake: ${v} is not set")
  endif()
endforeach()
file(REMOVE_RECURSE "${DIR}")
set(common --workers 2 --steps 40 --eval-every 10 --eval-subset 0 --train-size 2048
           --hidden 64 --guard off)
foreach(row "dense;--codec;dense" "static-x100;--codec;topk;--controller;static:factor=100")
  list(POP_FRONT row name)
  execute_process(COMMAND "${TRAIN}" ${common} --out "${DIR}/${name}" ${row}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "gradcomp_train (${name}) failed (${rc}):\n${out}")
  endif()
endforeach()
execute_process(COMMAND "${PYTHON}" "${TTA}" --rate unshaped --ranks 2 "dense=${DIR}/dense"
                        "static-x100=${DIR}/static-x100"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "time_to_accuracy.py failed (${rc})")
endif()
foreach(want "\\| dense \\| [0-9.]+ % \\| \\+0\\.00 \\| [0-9.]+ s \\| 40 \\|" "\\| static-x100")
  if(NOT out MATCHES "${want}")
    message(FATAL_ERROR "time_to_accuracy.py printed no line matching '${want}'")
  endif()
endforeach()
