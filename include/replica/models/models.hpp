#pragma once
// The standard networks.

#include "replica/models/alexnet.hpp"
#include "replica/models/fcn.hpp"
#include "replica/models/googlenet.hpp"
#include "replica/models/gpt.hpp"
#include "replica/models/lenet.hpp"
#include "replica/models/resnet.hpp"
#include "replica/models/text_cnn.hpp"
