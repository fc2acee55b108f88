// The one copy of nlohmann::json's parser, lexer and serializer the library links (io/json.h).
#include "io/json.h"

STRATA_JSON_INSTANCES()
