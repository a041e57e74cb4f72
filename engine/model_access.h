/*
 * model_access.h - private: the DeepSeek V4 model behind a public
 * ds4_model handle, for engine files other than session.c (which owns the
 * handle's layout) that need the bound weights or the configuration.
 */
#ifndef DS4_ENGINE_MODEL_ACCESS_H
#define DS4_ENGINE_MODEL_ACCESS_H

#include "include/ds4.h"
#include "model/dsv4_model.h"

const dsv4_model *ds4_model_dsv4(const ds4_model *m);

#endif
