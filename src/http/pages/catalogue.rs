//! Every text of the hosted pages, in each language they speak: one entry
//! a key, its name (what a template writes as `{{t.name}}`) and its text
//! in English, German, French and Spanish, in that order (the macro takes
//! no other). `i18n.rs` chooses the language and reads the texts.
//!
//! A text may name values of its page in braces (`{client}`, `{email}`,
//! `{n}`), filled in HTML-escaped. Texts whose templates put them in with
//! `{{{t.name}}}` are markup (`<strong>` around the application's name);
//! the others are plain text and escaped whole.

macro_rules! catalogue {
    ($($key:ident $name:literal { en: $en:literal, de: $de:literal, fr: $fr:literal, es: $es:literal, })*) => {
        /// A text of the pages.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Key {
            $($key,)*
        }

        impl Key {
            /// Every key, in the catalogue's order.
            pub const ALL: &'static [Key] = &[$(Key::$key,)*];

            /// The name templates use (`{{t.name}}`).
            pub fn name(self) -> &'static str {
                match self {
                    $(Key::$key => $name,)*
                }
            }

            /// The key a template names, if there is one.
            pub fn named(name: &str) -> Option<Key> {
                match name {
                    $($name => Some(Key::$key),)*
                    _ => None,
                }
            }

            /// The texts: English, German, French, Spanish.
            pub(super) fn texts(self) -> [&'static str; 4] {
                match self {
                    $(Key::$key => [$en, $de, $fr, $es],)*
                }
            }
        }
    };
}

catalogue! {
    // Titles.
    TitleSignIn "title_sign_in" {
        en: "Sign in",
        de: "Anmelden",
        fr: "Connexion",
        es: "Iniciar sesión",
    }
    TitleSecondStep "title_second_step" {
        en: "Second step",
        de: "Zweiter Schritt",
        fr: "Deuxième étape",
        es: "Segundo paso",
    }
    TitleAllow "title_allow" {
        en: "Allow access?",
        de: "Zugriff erlauben?",
        fr: "Autoriser l’accès ?",
        es: "¿Permitir el acceso?",
    }
    TitleCreateAccount "title_create_account" {
        en: "Create an account",
        de: "Konto erstellen",
        fr: "Créer un compte",
        es: "Crear una cuenta",
    }
    TitleCheckEmail "title_check_email" {
        en: "Check your email",
        de: "Prüfen Sie Ihre E-Mails",
        fr: "Consultez vos e-mails",
        es: "Revise su correo electrónico",
    }
    TitleResetPassword "title_reset_password" {
        en: "Reset your password",
        de: "Passwort zurücksetzen",
        fr: "Réinitialiser votre mot de passe",
        es: "Restablecer su contraseña",
    }
    TitleNewPassword "title_new_password" {
        en: "Choose a new password",
        de: "Neues Passwort wählen",
        fr: "Choisir un nouveau mot de passe",
        es: "Elegir una contraseña nueva",
    }
    TitleSignOut "title_sign_out" {
        en: "Sign out",
        de: "Abmelden",
        fr: "Déconnexion",
        es: "Cerrar sesión",
    }
    TitleSignedOut "title_signed_out" {
        en: "Signed out",
        de: "Abgemeldet",
        fr: "Déconnecté",
        es: "Sesión cerrada",
    }
    TitleError "title_error" {
        en: "Something is wrong",
        de: "Etwas stimmt nicht",
        fr: "Un problème est survenu",
        es: "Algo salió mal",
    }

    // Sign-in and sign-up.
    ContinueTo "continue_to" {
        en: "to continue to <strong>{client}</strong>",
        de: "weiter zu <strong>{client}</strong>",
        fr: "pour continuer vers <strong>{client}</strong>",
        es: "para continuar a <strong>{client}</strong>",
    }
    Email "email" {
        en: "Email",
        de: "E-Mail-Adresse",
        fr: "Adresse e-mail",
        es: "Correo electrónico",
    }
    Password "password" {
        en: "Password",
        de: "Passwort",
        fr: "Mot de passe",
        es: "Contraseña",
    }
    SignIn "sign_in" {
        en: "Sign in",
        de: "Anmelden",
        fr: "Se connecter",
        es: "Iniciar sesión",
    }
    SignInWithPasskey "sign_in_with_passkey" {
        en: "Sign in with a passkey",
        de: "Mit einem Passkey anmelden",
        fr: "Se connecter avec une clé d’accès",
        es: "Iniciar sesión con una llave de acceso",
    }
    OtherWaysIn "other_ways_in" {
        en: "Other ways in",
        de: "Weitere Möglichkeiten",
        fr: "Autres possibilités",
        es: "Otras opciones",
    }
    CreateAnAccount "create_an_account" {
        en: "Create an account",
        de: "Konto erstellen",
        fr: "Créer un compte",
        es: "Crear una cuenta",
    }
    ForgotPassword "forgot_password" {
        en: "Forgot your password?",
        de: "Passwort vergessen?",
        fr: "Mot de passe oublié ?",
        es: "¿Olvidó su contraseña?",
    }
    NewAccountPassword "new_account_password" {
        en: "Password (at least 8 characters)",
        de: "Passwort (mindestens 8 Zeichen)",
        fr: "Mot de passe (au moins 8 caractères)",
        es: "Contraseña (al menos 8 caracteres)",
    }
    CreateTheAccount "create_the_account" {
        en: "Create the account",
        de: "Konto anlegen",
        fr: "Créer le compte",
        es: "Crear la cuenta",
    }
    HaveAnAccount "have_an_account" {
        en: "I have an account",
        de: "Ich habe ein Konto",
        fr: "J’ai un compte",
        es: "Ya tengo una cuenta",
    }
    VerifySent "verify_sent" {
        en: "We emailed a 6-digit code to {email}. It is valid for 15 minutes.",
        de: "Wir haben einen 6-stelligen Code an {email} gesendet. Er ist 15 Minuten gültig.",
        fr: "Nous avons envoyé un code à 6 chiffres à {email}. Il est valable 15 minutes.",
        es: "Enviamos un código de 6 dígitos a {email}. Es válido durante 15 minutos.",
    }
    TheCode "the_code" {
        en: "The code",
        de: "Der Code",
        fr: "Le code",
        es: "El código",
    }
    Verify "verify" {
        en: "Verify",
        de: "Bestätigen",
        fr: "Vérifier",
        es: "Verificar",
    }

    // The second step.
    MfaIntro "mfa_intro" {
        en: "Your account has a second factor. Use one of them to continue to <strong>{client}</strong>.",
        de: "Ihr Konto ist mit einem zweiten Faktor geschützt. Bestätigen Sie damit die Anmeldung, um zu <strong>{client}</strong> zu gelangen.",
        fr: "Votre compte a un second facteur. Utilisez-le pour continuer vers <strong>{client}</strong>.",
        es: "Su cuenta tiene un segundo factor. Úselo para continuar a <strong>{client}</strong>.",
    }
    TotpCode "totp_code" {
        en: "Code from your authenticator app",
        de: "Code aus Ihrer Authenticator-App",
        fr: "Code de votre application d’authentification",
        es: "Código de su aplicación de autenticación",
    }
    Continue "continue" {
        en: "Continue",
        de: "Weiter",
        fr: "Continuer",
        es: "Continuar",
    }
    UsePasskey "use_passkey" {
        en: "Use my passkey",
        de: "Meinen Passkey verwenden",
        fr: "Utiliser ma clé d’accès",
        es: "Usar mi llave de acceso",
    }
    RecoveryCode "recovery_code" {
        en: "A recovery code",
        de: "Ein Wiederherstellungscode",
        fr: "Un code de récupération",
        es: "Un código de recuperación",
    }
    UseRecoveryCode "use_recovery_code" {
        en: "Use the recovery code",
        de: "Wiederherstellungscode verwenden",
        fr: "Utiliser le code de récupération",
        es: "Usar el código de recuperación",
    }

    // Password reset.
    ResetIntro "reset_intro" {
        en: "We will email you a code to choose a new password.",
        de: "Wir senden Ihnen einen Code per E-Mail, mit dem Sie ein neues Passwort wählen.",
        fr: "Nous vous enverrons par e-mail un code pour choisir un nouveau mot de passe.",
        es: "Le enviaremos por correo electrónico un código para elegir una contraseña nueva.",
    }
    SendTheCode "send_the_code" {
        en: "Send the code",
        de: "Code senden",
        fr: "Envoyer le code",
        es: "Enviar el código",
    }
    BackToSignIn "back_to_sign_in" {
        en: "Back to sign in",
        de: "Zurück zur Anmeldung",
        fr: "Retour à la connexion",
        es: "Volver a iniciar sesión",
    }
    ResetSent "reset_sent" {
        en: "If {email} has an account, we emailed it a 6-digit code.",
        de: "Falls es zu {email} ein Konto gibt, haben wir einen 6-stelligen Code dorthin gesendet.",
        fr: "Si {email} a un compte, nous lui avons envoyé un code à 6 chiffres.",
        es: "Si {email} tiene una cuenta, le enviamos un código de 6 dígitos.",
    }
    NewPassword "new_password" {
        en: "New password (at least 8 characters)",
        de: "Neues Passwort (mindestens 8 Zeichen)",
        fr: "Nouveau mot de passe (au moins 8 caractères)",
        es: "Contraseña nueva (al menos 8 caracteres)",
    }
    SetThePassword "set_the_password" {
        en: "Set the password",
        de: "Passwort festlegen",
        fr: "Définir le mot de passe",
        es: "Establecer la contraseña",
    }
    PasswordChanged "password_changed" {
        en: "Your password is changed: sign in with it.",
        de: "Ihr Passwort ist geändert: Melden Sie sich damit an.",
        fr: "Votre mot de passe est changé : connectez-vous avec celui-ci.",
        es: "Su contraseña se ha cambiado: inicie sesión con ella.",
    }

    // Consent.
    AsksTo "asks_to" {
        en: "<strong>{client}</strong> asks to:",
        de: "<strong>{client}</strong> möchte:",
        fr: "<strong>{client}</strong> demande à :",
        es: "<strong>{client}</strong> solicita:",
    }
    ScopeOpenid "scope_openid" {
        en: "Sign you in with your latchkey account",
        de: "Sie mit Ihrem latchkey-Konto anmelden",
        fr: "Vous connecter avec votre compte latchkey",
        es: "Iniciar su sesión con su cuenta de latchkey",
    }
    ScopeEmail "scope_email" {
        en: "See your email address",
        de: "Ihre E-Mail-Adresse sehen",
        fr: "Voir votre adresse e-mail",
        es: "Ver su dirección de correo electrónico",
    }
    ScopeProfile "scope_profile" {
        en: "See your name",
        de: "Ihren Namen sehen",
        fr: "Voir votre nom",
        es: "Ver su nombre",
    }
    ScopeOfflineAccess "scope_offline_access" {
        en: "Stay signed in while you are away",
        de: "Angemeldet bleiben, während Sie nicht da sind",
        fr: "Rester connecté en votre absence",
        es: "Mantener la sesión iniciada mientras no está",
    }
    ScopeUnknown "scope_unknown" {
        en: "Something this service does not know",
        de: "Etwas, das dieser Dienst nicht kennt",
        fr: "Quelque chose que ce service ne connaît pas",
        es: "Algo que este servicio no conoce",
    }
    SignedInAs "signed_in_as" {
        en: "You are signed in as {email}.",
        de: "Sie sind als {email} angemeldet.",
        fr: "Vous êtes connecté en tant que {email}.",
        es: "Ha iniciado sesión como {email}.",
    }
    Allow "allow" {
        en: "Allow",
        de: "Erlauben",
        fr: "Autoriser",
        es: "Permitir",
    }
    Deny "deny" {
        en: "Deny",
        de: "Ablehnen",
        fr: "Refuser",
        es: "Denegar",
    }

    // Logout.
    SignOutQuestion "sign_out_question" {
        en: "Sign out of latchkey{requester}? Every application you signed in to here is signed out too.",
        de: "Von latchkey abmelden{requester}? Jede Anwendung, bei der Sie sich hier angemeldet haben, wird ebenfalls abgemeldet.",
        fr: "Se déconnecter de latchkey{requester} ? Toutes les applications auxquelles vous vous êtes connecté ici seront aussi déconnectées.",
        es: "¿Cerrar sesión en latchkey{requester}? También se cerrará la sesión en todas las aplicaciones en las que la inició aquí.",
    }
    AskedBy "asked_by" {
        en: "asked by {client}",
        de: "angefragt von {client}",
        fr: "demandé par {client}",
        es: "solicitado por {client}",
    }
    SignOut "sign_out" {
        en: "Sign out",
        de: "Abmelden",
        fr: "Se déconnecter",
        es: "Cerrar sesión",
    }
    SignedOut "signed_out" {
        en: "You are signed out. You may close this window.",
        de: "Sie sind abgemeldet. Sie können dieses Fenster schließen.",
        fr: "Vous êtes déconnecté. Vous pouvez fermer cette fenêtre.",
        es: "Ha cerrado la sesión. Puede cerrar esta ventana.",
    }

    // The error page.
    ErrorHint "error_hint" {
        en: "If you came here from an application, go back to it and try again.",
        de: "Wenn Sie von einer Anwendung hierher gekommen sind, kehren Sie zu ihr zurück und versuchen Sie es erneut.",
        fr: "Si vous venez d’une application, retournez-y et réessayez.",
        es: "Si llegó aquí desde una aplicación, vuelva a ella e inténtelo de nuevo.",
    }

    // What a refused step says.
    WrongCredentials "wrong_credentials" {
        en: "The email or the password is wrong.",
        de: "Die E-Mail-Adresse oder das Passwort ist falsch.",
        fr: "L’adresse e-mail ou le mot de passe est incorrect.",
        es: "El correo electrónico o la contraseña no son correctos.",
    }
    NotVerified "not_verified" {
        en: "This email address is not verified yet: enter the code we emailed, or create the account again for a new one.",
        de: "Diese E-Mail-Adresse ist noch nicht bestätigt: Geben Sie den Code aus unserer E-Mail ein, oder erstellen Sie das Konto erneut, um einen neuen zu erhalten.",
        fr: "Cette adresse e-mail n’est pas encore vérifiée : saisissez le code que nous vous avons envoyé, ou créez à nouveau le compte pour en recevoir un autre.",
        es: "Esta dirección de correo electrónico aún no está verificada: introduzca el código que le enviamos o vuelva a crear la cuenta para recibir uno nuevo.",
    }
    AccountDisabled "account_disabled" {
        en: "This account is disabled.",
        de: "Dieses Konto ist deaktiviert.",
        fr: "Ce compte est désactivé.",
        es: "Esta cuenta está desactivada.",
    }
    WrongCode "wrong_code" {
        en: "That code is wrong or expired.",
        de: "Dieser Code ist falsch oder abgelaufen.",
        fr: "Ce code est incorrect ou a expiré.",
        es: "Ese código es incorrecto o ha caducado.",
    }
    FactorFailedTries "factor_failed_tries" {
        en: "That did not work. {n} more tries for this sign-in.",
        de: "Das hat nicht geklappt. Noch {n} Versuche für diese Anmeldung.",
        fr: "Cela n’a pas fonctionné. Encore {n} essais pour cette connexion.",
        es: "No ha funcionado. Quedan {n} intentos para este inicio de sesión.",
    }
    FactorFailed "factor_failed" {
        en: "That did not work.",
        de: "Das hat nicht geklappt.",
        fr: "Cela n’a pas fonctionné.",
        es: "No ha funcionado.",
    }
    StepExpired "step_expired" {
        en: "This step has expired or was used already: start again.",
        de: "Dieser Schritt ist abgelaufen oder wurde schon verwendet: Beginnen Sie von vorn.",
        fr: "Cette étape a expiré ou a déjà été utilisée : recommencez.",
        es: "Este paso ha caducado o ya se utilizó: empiece de nuevo.",
    }
    TooManyAttempts "too_many_attempts" {
        en: "Too many attempts: try again in {n} seconds.",
        de: "Zu viele Versuche: Versuchen Sie es in {n} Sekunden erneut.",
        fr: "Trop de tentatives : réessayez dans {n} secondes.",
        es: "Demasiados intentos: inténtelo de nuevo en {n} segundos.",
    }
    TooManyRequests "too_many_requests" {
        en: "Too many requests: try again in {n} seconds.",
        de: "Zu viele Anfragen: Versuchen Sie es in {n} Sekunden erneut.",
        fr: "Trop de requêtes : réessayez dans {n} secondes.",
        es: "Demasiadas solicitudes: inténtelo de nuevo en {n} segundos.",
    }
    Busy "busy" {
        en: "The service is busy: try again in a moment.",
        de: "Der Dienst ist ausgelastet: Versuchen Sie es gleich noch einmal.",
        fr: "Le service est surchargé : réessayez dans un instant.",
        es: "El servicio está ocupado: inténtelo de nuevo en un momento.",
    }
    EmailTaken "email_taken" {
        en: "This email address has an account already.",
        de: "Zu dieser E-Mail-Adresse gibt es bereits ein Konto.",
        fr: "Cette adresse e-mail a déjà un compte.",
        es: "Esta dirección de correo electrónico ya tiene una cuenta.",
    }
    Internal "internal" {
        en: "Something went wrong on our side: try again.",
        de: "Bei uns ist etwas schiefgelaufen: Versuchen Sie es erneut.",
        fr: "Une erreur s’est produite de notre côté : réessayez.",
        es: "Algo salió mal por nuestra parte: inténtelo de nuevo.",
    }
    InvalidEmail "invalid_email" {
        en: "Enter a plain email address such as name@example.com (at most 254 characters; no display name, quotes or spaces).",
        de: "Geben Sie eine einfache E-Mail-Adresse wie name@example.com ein (höchstens 254 Zeichen; ohne Anzeigenamen, Anführungszeichen oder Leerzeichen).",
        fr: "Saisissez une adresse e-mail simple comme name@example.com (254 caractères au plus ; sans nom affiché, guillemets ni espaces).",
        es: "Introduzca una dirección de correo electrónico simple como name@example.com (254 caracteres como máximo; sin nombre visible, comillas ni espacios).",
    }
    InvalidPassword "invalid_password" {
        en: "The password must be 8 to 128 characters.",
        de: "Das Passwort muss 8 bis 128 Zeichen lang sein.",
        fr: "Le mot de passe doit comporter de 8 à 128 caractères.",
        es: "La contraseña debe tener entre 8 y 128 caracteres.",
    }
    InvalidCode "invalid_code" {
        en: "The code is 6 digits.",
        de: "Der Code besteht aus 6 Ziffern.",
        fr: "Le code comporte 6 chiffres.",
        es: "El código tiene 6 dígitos.",
    }
    NotSignedIn "not_signed_in" {
        en: "You are not signed in any more: start again from the application.",
        de: "Sie sind nicht mehr angemeldet: Beginnen Sie erneut in der Anwendung.",
        fr: "Vous n’êtes plus connecté : recommencez depuis l’application.",
        es: "Ya no tiene la sesión iniciada: empiece de nuevo desde la aplicación.",
    }
    EnterAFactor "enter_a_factor" {
        en: "Enter a code, a recovery code or use a passkey.",
        de: "Geben Sie einen Code oder einen Wiederherstellungscode ein, oder verwenden Sie einen Passkey.",
        fr: "Saisissez un code, un code de récupération, ou utilisez une clé d’accès.",
        es: "Introduzca un código o un código de recuperación, o use una llave de acceso.",
    }
    PasskeyNoAnswer "passkey_no_answer" {
        en: "The passkey gave no answer.",
        de: "Der Passkey hat nicht geantwortet.",
        fr: "La clé d’accès n’a pas répondu.",
        es: "La llave de acceso no respondió.",
    }
    LinkDamaged "link_damaged" {
        en: "This link is damaged or too old: start again from the application.",
        de: "Dieser Link ist beschädigt oder zu alt: Beginnen Sie erneut in der Anwendung.",
        fr: "Ce lien est endommagé ou trop ancien : recommencez depuis l’application.",
        es: "Este enlace está dañado o es demasiado antiguo: empiece de nuevo desde la aplicación.",
    }
    ForeignForm "foreign_form" {
        en: "This form did not come from this service's page (or your browser refused its cookie): go back and try again.",
        de: "Dieses Formular stammt nicht von einer Seite dieses Dienstes (oder Ihr Browser hat dessen Cookie abgelehnt): Gehen Sie zurück und versuchen Sie es erneut.",
        fr: "Ce formulaire ne vient pas d’une page de ce service (ou votre navigateur a refusé son cookie) : revenez en arrière et réessayez.",
        es: "Este formulario no procede de una página de este servicio (o su navegador rechazó su cookie): vuelva atrás e inténtelo de nuevo.",
    }

    // Why a request ends on an error page (domain::oidc::PageError).
    PendingExpired "pending_expired" {
        en: "This sign-in took too long or its link is damaged: start again from the application.",
        de: "Diese Anmeldung hat zu lange gedauert oder ihr Link ist beschädigt: Beginnen Sie erneut in der Anwendung.",
        fr: "Cette connexion a pris trop de temps ou son lien est endommagé : recommencez depuis l’application.",
        es: "Este inicio de sesión tardó demasiado o su enlace está dañado: empiece de nuevo desde la aplicación.",
    }
    NoClientId "no_client_id" {
        en: "The request names no client (client_id).",
        de: "Die Anfrage nennt keinen Client (client_id).",
        fr: "La requête ne nomme aucun client (client_id).",
        es: "La solicitud no indica ningún cliente (client_id).",
    }
    UnknownClient "unknown_client" {
        en: "The application that sent you here is not registered for signing in.",
        de: "Die Anwendung, die Sie hierher geschickt hat, ist nicht für die Anmeldung registriert.",
        fr: "L’application qui vous a envoyé ici n’est pas enregistrée pour la connexion.",
        es: "La aplicación que le envió aquí no está registrada para iniciar sesión.",
    }
    NoRedirectUri "no_redirect_uri" {
        en: "The request has no redirect_uri.",
        de: "Die Anfrage hat keine redirect_uri.",
        fr: "La requête n’a pas de redirect_uri.",
        es: "La solicitud no tiene redirect_uri.",
    }
    UnregisteredRedirectUri "unregistered_redirect_uri" {
        en: "The address the application asked to be sent back to is not one it registered.",
        de: "Die Adresse, an die die Anwendung Sie zurückschicken lassen möchte, hat sie nicht registriert.",
        fr: "L’adresse de retour demandée par l’application n’est pas l’une de celles qu’elle a enregistrées.",
        es: "La dirección de retorno que pidió la aplicación no es una de las que registró.",
    }
    RepeatedClientOrRedirectUri "repeated_client_or_redirect_uri" {
        en: "client_id and redirect_uri must be given once.",
        de: "client_id und redirect_uri dürfen nur einmal angegeben werden.",
        fr: "client_id et redirect_uri doivent être donnés une seule fois.",
        es: "client_id y redirect_uri deben indicarse una sola vez.",
    }
    ClientGone "client_gone" {
        en: "The application is no longer registered.",
        de: "Die Anwendung ist nicht mehr registriert.",
        fr: "L’application n’est plus enregistrée.",
        es: "La aplicación ya no está registrada.",
    }
    NoLongerAllowed "no_longer_allowed" {
        en: "The application no longer signs in through this address: start again from it.",
        de: "Die Anwendung meldet nicht mehr über diese Adresse an: Beginnen Sie erneut in der Anwendung.",
        fr: "L’application ne passe plus par cette adresse pour la connexion : recommencez depuis l’application.",
        es: "La aplicación ya no inicia sesión a través de esta dirección: empiece de nuevo desde ella.",
    }
    ConsentNotYours "consent_not_yours" {
        en: "This consent is not yours, or it took too long: start again from the application.",
        de: "Diese Zustimmung gehört nicht zu Ihrer Anmeldung, oder sie hat zu lange gedauert: Beginnen Sie erneut in der Anwendung.",
        fr: "Ce consentement n’est pas le vôtre, ou il a pris trop de temps : recommencez depuis l’application.",
        es: "Este consentimiento no es suyo o tardó demasiado: empiece de nuevo desde la aplicación.",
    }
    ForeignIdTokenHint "foreign_id_token_hint" {
        en: "The id_token_hint is not one this service issued.",
        de: "Der id_token_hint wurde nicht von diesem Dienst ausgestellt.",
        fr: "Le id_token_hint n’a pas été émis par ce service.",
        es: "El id_token_hint no lo emitió este servicio.",
    }
    HintOfAnotherClient "hint_of_another_client" {
        en: "client_id and the id_token_hint name different applications.",
        de: "client_id und id_token_hint nennen verschiedene Anwendungen.",
        fr: "client_id et id_token_hint désignent des applications différentes.",
        es: "client_id y id_token_hint indican aplicaciones distintas.",
    }
    LogoutRedirectWithoutClient "logout_redirect_without_client" {
        en: "A post_logout_redirect_uri needs the application's client_id or id_token_hint.",
        de: "Eine post_logout_redirect_uri braucht die client_id oder den id_token_hint der Anwendung.",
        fr: "Une post_logout_redirect_uri nécessite le client_id ou le id_token_hint de l’application.",
        es: "Una post_logout_redirect_uri necesita el client_id o el id_token_hint de la aplicación.",
    }
    UnregisteredLogoutRedirect "unregistered_logout_redirect" {
        en: "The post_logout_redirect_uri is not one the application registered.",
        de: "Die post_logout_redirect_uri hat die Anwendung nicht registriert.",
        fr: "La post_logout_redirect_uri n’est pas l’une de celles que l’application a enregistrées.",
        es: "La post_logout_redirect_uri no es una de las que registró la aplicación.",
    }
    // Signing in through an upstream provider ({name}: its display name).
    ContinueWith "continue_with" {
        en: "Continue with {name}",
        de: "Weiter mit {name}",
        fr: "Continuer avec {name}",
        es: "Continuar con {name}",
    }
    UpstreamFailed "upstream_failed" {
        en: "Signing in with {name} did not work. Try again, or sign in another way.",
        de: "Die Anmeldung mit {name} hat nicht geklappt. Versuchen Sie es erneut oder melden Sie sich anders an.",
        fr: "La connexion avec {name} n’a pas abouti. Réessayez, ou connectez-vous autrement.",
        es: "El inicio de sesión con {name} no funcionó. Inténtelo de nuevo o inicie sesión de otra forma.",
    }
    UpstreamUnknown "upstream_unknown" {
        en: "That is not a way to sign in here.",
        de: "Das ist hier keine Möglichkeit zur Anmeldung.",
        fr: "Ce n’est pas un moyen de se connecter ici.",
        es: "Esa no es una forma de iniciar sesión aquí.",
    }
    UpstreamJourney "upstream_journey" {
        en: "This sign-in took too long or began in another browser. Please start again.",
        de: "Diese Anmeldung hat zu lange gedauert oder wurde in einem anderen Browser begonnen. Bitte beginnen Sie erneut.",
        fr: "Cette connexion a pris trop de temps ou a commencé dans un autre navigateur. Veuillez recommencer.",
        es: "Este inicio de sesión tardó demasiado o empezó en otro navegador. Vuelva a empezar.",
    }
    UpstreamUnverified "upstream_unverified" {
        en: "{name} did not confirm your email address, so it cannot sign you in here.",
        de: "{name} hat Ihre E-Mail-Adresse nicht bestätigt und kann Sie hier daher nicht anmelden.",
        fr: "{name} n’a pas confirmé votre adresse e-mail : il ne peut donc pas vous connecter ici.",
        es: "{name} no confirmó su dirección de correo, así que no puede iniciar su sesión aquí.",
    }
    UpstreamNoAccount "upstream_no_account" {
        en: "No account here is linked to your {name} account.",
        de: "Kein Konto hier ist mit Ihrem {name}-Konto verknüpft.",
        fr: "Aucun compte ici n’est lié à votre compte {name}.",
        es: "Ninguna cuenta de aquí está vinculada a su cuenta de {name}.",
    }
    UpstreamProveFirst "upstream_prove_first" {
                en: "An account with your address exists here, and {name} is not linked to it. Sign in to it; you will be asked whether to link them.",
                de: "Hier gibt es bereits ein Konto mit Ihrer Adresse, und {name} ist nicht damit verknüpft. Melden Sie sich dort an; danach werden Sie gefragt, ob Sie die Konten verknüpfen möchten.",
                fr: "Un compte avec votre adresse existe ici, et {name} n’y est pas lié. Connectez-vous à ce compte ; il vous sera demandé si vous voulez les lier.",
                es: "Aquí existe una cuenta con su dirección y {name} no está vinculado a ella. Inicie sesión en ella; se le preguntará si desea vincularlas.",
    }
    UpstreamProveMailbox "upstream_prove_mailbox" {
        en: "An account with your address exists here, but its address was never confirmed, and {name} is not linked to it. Use \u{201c}Forgot your password?\u{201d} to prove the address with a mailed code.",
        de: "Hier gibt es ein Konto mit Ihrer Adresse, deren Bestätigung aber nie abgeschlossen wurde, und {name} ist nicht damit verknüpft. Weisen Sie die Adresse über \u{201e}Passwort vergessen?\u{201c} mit einem zugesandten Code nach.",
        fr: "Un compte avec votre adresse existe ici, mais son adresse n’a jamais été confirmée, et {name} n’y est pas lié. Utilisez « Mot de passe oublié ? » pour prouver l’adresse avec un code envoyé par e-mail.",
        es: "Aquí existe una cuenta con su dirección, pero la dirección nunca se confirmó y {name} no está vinculado a ella. Use «¿Olvidó su contraseña?» para demostrar la dirección con un código enviado por correo.",
    }
    TitleLink "title_link" {
        en: "Link an account",
        de: "Konto verknüpfen",
        fr: "Lier un compte",
        es: "Vincular una cuenta",
    }
    LinkAsk "link_ask" {
        en: "Link your {name} account ({email}) to this account? From then on, \u{201c}Continue with {name}\u{201d} signs you in here.",
        de: "Ihr {name}-Konto ({email}) mit diesem Konto verknüpfen? Danach meldet Sie \u{201e}Weiter mit {name}\u{201c} hier an.",
        fr: "Lier votre compte {name} ({email}) à ce compte ? Ensuite, « Continuer avec {name} » vous connectera ici.",
        es: "¿Vincular su cuenta de {name} ({email}) a esta cuenta? Después, «Continuar con {name}» iniciará su sesión aquí.",
    }
    LinkYes "link_yes" {
        en: "Link",
        de: "Verknüpfen",
        fr: "Lier",
        es: "Vincular",
    }
    LinkNo "link_no" {
        en: "Not now",
        de: "Jetzt nicht",
        fr: "Pas maintenant",
        es: "Ahora no",
    }
}
