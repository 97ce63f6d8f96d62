// train: trains a model of the zoo (mlp, cnn, gpt), or one of files' data, on one device
// or under a launcher. See --help and docs/train.md; the program is train_main.h's call
// with the zoo's catalog.
#include "models/train/zoo_catalog.h"
#include "trainer/train_main.h"

int main(int argc, char** argv) {
  return ddp::train::train_main(argc, argv, {.catalog = ddp::models::zoo_catalog()});
}
