// train: trains a model of the zoo (mlp, cnn, gpt), or one of files' data, on one device
// or under a launcher. See --help and docs/train.md; the program is train_main.h's call.
#include "models/train/train_main.h"

int main(int argc, char** argv) {
  return ddp::train::train_main(argc, argv);
}
