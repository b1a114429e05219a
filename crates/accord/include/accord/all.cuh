// Every Accord device header.
#pragma once
#include <accord/channel.cuh>
