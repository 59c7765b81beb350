#pragma once
// Each subcommand lives in its own app/cmd_*.cpp and takes the arguments after its name.
// They return the process exit code; spillway::Error escapes to main, which prints it.
namespace spillway {

int cmd_bench(int argc, char** argv);
int cmd_gate(int argc, char** argv);
int cmd_info(int argc, char** argv);
int cmd_make_model(int argc, char** argv);
int cmd_plan(int argc, char** argv);
int cmd_probe(int argc, char** argv);
int cmd_run(int argc, char** argv);

}  // namespace spillway
