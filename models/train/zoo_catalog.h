// The zoo as train's --model catalog (trainer/task.h): the mlp and cnn
// (models/zoo.h) are supervised models built for the data's shapes; the gpt
// models (models/gpt_config.h) are language models, their task
// models/train/language_task.cpp (text as bytes, or token shards).
#pragma once

#include "trainer/task.h"

#include <memory>

namespace ddp::models {

std::shared_ptr<const train::ModelCatalog> zoo_catalog();

}  // namespace ddp::models

namespace ddp::train {

// The gpt models on the Brown corpus, a synthetic stream or token shards.
std::unique_ptr<Task> make_language_task(const TrainOptions& o, const Device& device, int rank,
                                         int world_size);

}  // namespace ddp::train
